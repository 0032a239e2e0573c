"""The contract (CONTRACT.md) built from torch's own layers: a second, independent correct subject.

The stacks are nn.TransformerEncoder / nn.TransformerDecoder of batch_first
nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (norm_first for pre-LN), so
named_parameters() carry torch's names (`encoder.layers.0.self_attn.in_proj_weight`, ...),
while state_dict() / load_state_dict() speak the contract's names
(`encoder.0.self_attn.q_proj.weight`).
Nothing here is shared with impl/transformer.py: agreement between the two is evidence, not an echo.

decode_step keeps its own KV cache (torch's layers have none): each decoder layer's self-attention
projects only the new position through torch's in_proj rows and attends to the cached keys and
values with F.scaled_dot_product_attention; the rest of the layer is torch's own blocks. Nothing of
impl's cache is shared, so agreement of the two checks both.

In eval mode under no_grad torch runs fused kernels (_transformer_encoder_layer_fwd,
_native_multi_head_attention) in float32 and float64 alike; with enable_nested_tensor=False the
encoder never packs rows into nested tensors, so padded rows stay dense (their values are outside
the contract). Real rows agree with the slow path within 2e-15 in float64 (a test checks 1e-12).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

NORMS = ("post", "pre")
_D = TypeVar("_D", bound=dict[str, Any])  # a state_dict destination, as torch types it


@dataclass
class TransformerConfig:
    """The contract's configuration (CONTRACT.md, TransformerConfig)."""

    src_vocab: int  # source vocabulary size
    tgt_vocab: int  # target vocabulary size
    d_model: int = 512  # model width d
    n_heads: int = 8  # attention heads h; d_model % n_heads == 0
    d_ff: int = 2048  # feed-forward width
    n_enc: int = 6  # encoder layers
    n_dec: int = 6  # decoder layers
    dropout: float = 0.1  # embeddings, sublayer outputs, attention weights, inside FF
    norm: Literal["post", "pre"] = "post"  # LN(x + F(x)) or x + F(LN(x)) plus a final LN
    tie_embeddings: bool = True  # share embedding tables and the output layer
    max_len: int = 256  # longest sequence accepted
    ln_eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )


def _as_config(cfg: Any) -> TransformerConfig:
    """Any object with the TransformerConfig attributes (or a dict of them) as our dataclass."""
    names = [f.name for f in dataclasses.fields(TransformerConfig)]
    if isinstance(cfg, Mapping):
        return TransformerConfig(**{k: cfg[k] for k in names if k in cfg})
    return TransformerConfig(**{k: getattr(cfg, k) for k in names if hasattr(cfg, k)})


def positional_encoding(length: int, d: int, dtype: torch.dtype, device: Any = None) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (paper, 3.5).

    Computed in float64 on every call and only then cast, so a float64 model gets exact values
    (a float32 buffer promoted by .double() would not).
    """
    p = torch.arange(length, dtype=torch.float64, device=device)[:, None]  # [T, 1]
    two_i = torch.arange(0, d, 2, dtype=torch.float64, device=device)  # [ceil(d/2)]
    angle = p / torch.pow(10000.0, two_i / d)  # [T, ceil(d/2)]
    pe = torch.empty(length, d, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe.to(dtype)


@dataclass(frozen=True)
class DecodeState:
    """The decoding position, the source mask and each decoder layer's self-attention keys and
    values of the positions fed so far (bos first), each [B, h, pos, d_k]."""

    pos: int
    src_mask: Tensor  # [B, S] bool
    cache: tuple[tuple[Tensor, Tensor], ...]

    def select(self, rows: Tensor) -> DecodeState:
        """The state of the given batch rows (beam search reorders hypotheses)."""
        cache = tuple((k[rows], v[rows]) for k, v in self.cache)
        return DecodeState(self.pos, self.src_mask[rows], cache)


def _check_ids_and_mask(ids: Tensor, mask: Tensor, what: str, max_len: int) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{what}_mask must be a bool tensor (True = real token), got {got}")
    if ids.dim() != 2:
        raise ValueError(f"{what} ids must be [B, L], got shape {tuple(ids.shape)}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{what}_mask shape {tuple(mask.shape)} differs from {what} ids {tuple(ids.shape)}"
        )
    if ids.shape[1] > max_len:
        raise ValueError(f"{what} length {ids.shape[1]} exceeds max_len {max_len}")


def _decoder_layer_step(
    layer: nn.TransformerDecoderLayer,
    x: Tensor,
    past: tuple[Tensor, Tensor],
    memory: Tensor,
    memory_padding: Tensor,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """torch's decoder layer for one new position x [B, 1, d]: self-attention projects x alone
    (in_proj's q, k, v rows) and reads the cached keys and values past plus its own; cross-attention
    and the feed-forward are the layer's own blocks. Returns x and the keys and values so far."""
    attn = layer.self_attn
    B, _, d = x.shape
    h = attn.num_heads

    def self_attention(z: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        q, k, v = (
            part.view(B, 1, h, d // h).transpose(1, 2)  # [B, h, 1, d_k]
            for part in F.linear(z, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
        )
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        p = attn.dropout if attn.training else 0.0
        heads = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # every key is <= t
        return layer.dropout1(attn.out_proj(heads.transpose(1, 2).reshape(B, 1, d))), (k, v)

    if layer.norm_first:
        a, kv = self_attention(layer.norm1(x))
        x = x + a
        x = x + layer._mha_block(layer.norm2(x), memory, None, memory_padding)
        x = x + layer._ff_block(layer.norm3(x))
    else:
        a, kv = self_attention(x)
        x = layer.norm1(x + a)
        x = layer.norm2(x + layer._mha_block(x, memory, None, memory_padding))
        x = layer.norm3(x + layer._ff_block(x))
    return x, kv


def _check_src_mask(src_mask: Tensor) -> None:
    if not isinstance(src_mask, Tensor) or src_mask.dtype != torch.bool:
        got = src_mask.dtype if isinstance(src_mask, Tensor) else type(src_mask).__name__
        raise TypeError(f"src_mask must be a bool tensor (True = real token), got {got}")
    if src_mask.dim() != 2:
        raise ValueError(f"src_mask must be [B, S], got shape {tuple(src_mask.shape)}")
    empty = (~src_mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"source rows {empty} have no real token (src_mask all False)")


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, section 3) on torch's layers."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        cfg = _as_config(cfg)
        self.cfg = cfg
        d = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        # Tying (CONTRACT.md): equal vocabularies share one table for everything; unequal ones
        # share the target table with the output layer. A tied table is registered once.
        self._one_table = cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
        if not self._one_table:
            self.tgt_emb = nn.Embedding(cfg.tgt_vocab, d)
        pre = cfg.norm == "pre"
        layer_args = dict(
            d_model=d,
            nhead=cfg.n_heads,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout,
            activation="relu",
            layer_norm_eps=cfg.ln_eps,
            batch_first=True,
            norm_first=pre,
        )
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_args),
            cfg.n_enc,
            norm=nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None,
            enable_nested_tensor=False,
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_args),
            cfg.n_dec,
            norm=nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None,
        )
        if not cfg.tie_embeddings:
            self.out = nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.emb_dropout = nn.Dropout(cfg.dropout)
        # The stacks deep-copy one layer; fresh draws per matrix make the layers differ.
        for p in [*self.encoder.parameters(), *self.decoder.parameters()]:
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        # Embedding tables start at N(0, 1/d), so E * sqrt(d) has the unit scale of PE.
        for table in self._tables():
            nn.init.normal_(table, std=d**-0.5)

    def _tables(self) -> list[Tensor]:
        return [self.src_emb.weight] + ([] if self._one_table else [self.tgt_emb.weight])

    def _tgt_table(self) -> Tensor:
        return self.src_emb.weight if self._one_table else self.tgt_emb.weight

    def _out_weight(self) -> Tensor:
        return self.out.weight if not self.cfg.tie_embeddings else self._tgt_table()

    def _embed(self, ids: Tensor, table: Tensor) -> Tensor:
        """x0 = E[ids] * sqrt(d) + PE (paper, 3.4 and 3.5), then dropout."""
        d = self.cfg.d_model
        x = F.embedding(ids, table) * math.sqrt(d)  # [B, L, d]
        return self.emb_dropout(x + positional_encoding(ids.shape[1], d, x.dtype, x.device))

    # --- the contract's forward computation -------------------------------------------------

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """memory [B, S, d]: the encoder stack over the source; padding keys are ignored."""
        _check_ids_and_mask(src, src_mask, "src", self.cfg.max_len)
        _check_src_mask(src_mask)
        x = self._embed(src, self.src_emb.weight)
        # torch's key_padding_mask says True = ignore: the negation of ours.
        return self.encoder(x, src_key_padding_mask=~src_mask)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """logits [B, T, V_tgt] = decoder(tgt_in, memory) @ W_out^T, causal and padding masked."""
        _check_ids_and_mask(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        _check_src_mask(src_mask)
        B, T = tgt_in.shape
        if memory.dim() != 3 or memory.shape[:2] != src_mask.shape:
            raise ValueError(
                f"memory shape {tuple(memory.shape)} does not match src_mask "
                f"{tuple(src_mask.shape)} as [B, S, d]"
            )
        if memory.shape[0] != B:
            raise ValueError(f"batch sizes differ: tgt_in has {B} rows, memory {memory.shape[0]}")
        if T and not bool(tgt_mask[:, 0].all()):
            bad = (~tgt_mask[:, 0]).nonzero().flatten().tolist()
            raise ValueError(f"target rows {bad} have padding at position 0 (bos must be real)")
        y = self._embed(tgt_in, self._tgt_table())
        # Both masks bool (True = ignore) so torch sees one mask dtype and does not warn.
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # key j > t
        y = self.decoder(
            y,
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=~tgt_mask,
            memory_key_padding_mask=~src_mask,
        )
        return y @ self._out_weight().T  # [B, T, V_tgt]

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """logits = decode(tgt_in, encode(src, src_mask), src_mask, tgt_mask)."""
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                f"batch sizes differ: src has {src.shape[0]}, tgt_in {tgt_in.shape[0]}"
            )
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def init_state(self, src_mask: Tensor) -> DecodeState:
        """The state before bos: position 0, empty caches."""
        _check_src_mask(src_mask)
        p = self.src_emb.weight
        h = self.cfg.n_heads
        empty = p.new_zeros(src_mask.shape[0], h, 0, self.cfg.d_model // h)
        return DecodeState(0, src_mask, tuple((empty, empty) for _ in self.decoder.layers))

    def decode_step(
        self, y_prev: Tensor, memory: Tensor, state: DecodeState
    ) -> tuple[Tensor, DecodeState]:
        """Logits [B, V_tgt] of the state's position: the new position only, through each
        decoder layer, its self-attention reading the cached keys and values."""
        B, t = state.src_mask.shape[0], state.pos
        if y_prev.shape != (B,):
            raise ValueError(f"y_prev must be [B] = [{B}], got shape {tuple(y_prev.shape)}")
        if memory.dim() != 3 or memory.shape[:2] != state.src_mask.shape:
            raise ValueError(
                f"memory shape {tuple(memory.shape)} does not match src_mask "
                f"{tuple(state.src_mask.shape)} as [B, S, d]"
            )
        if t >= self.cfg.max_len:
            raise ValueError(f"position {t} exceeds max_len {self.cfg.max_len}")
        d = self.cfg.d_model
        x = F.embedding(y_prev[:, None], self._tgt_table()) * math.sqrt(d)  # [B, 1, d]
        x = self.emb_dropout(x + positional_encoding(t + 1, d, x.dtype, x.device)[t:])
        cache = []
        for layer, past in zip(self.decoder.layers, state.cache, strict=True):
            x, kv = _decoder_layer_step(layer, x, past, memory, ~state.src_mask)
            cache.append(kv)
        if self.decoder.norm is not None:
            x = self.decoder.norm(x)
        logits = (x @ self._out_weight().T)[:, 0]  # [B, V_tgt]
        return logits, DecodeState(t + 1, state.src_mask, tuple(cache))

    # --- state_dict in the contract's names -------------------------------------------------

    def _contract_views(self) -> dict[str, tuple[str, slice | None]]:
        """contract name -> (torch parameter name, rows of it), in named_parameters order."""
        d = self.cfg.d_model
        views: dict[str, tuple[str, slice | None]] = {}
        for name, _ in self.named_parameters():
            stack, _, rest = name.partition(".")
            if stack in ("encoder", "decoder"):
                if rest.startswith("norm."):  # pre-LN's final LayerNorm
                    views[f"{stack[:3]}_norm.{rest[5:]}"] = (name, None)
                    continue
                # layers.{i}.<sub> -> {i}.<sub>; torch's cross-attention is multihead_attn
                contract = f"{stack}.{rest[len('layers.') :]}".replace(
                    "multihead_attn", "cross_attn"
                )
                head, _, leaf = contract.rpartition(".")
                if leaf.startswith("in_proj_"):  # q, k, v stacked in that order
                    kind = leaf[len("in_proj_") :]
                    for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                        views[f"{head}.{proj}.{kind}"] = (name, slice(j * d, (j + 1) * d))
                    continue
                views[contract] = (name, None)
            else:
                views[name] = (name, None)
        return views

    @overload  # torch's two signatures: into a given destination, or into a new dict
    def state_dict(self, *, destination: _D, prefix: str = ..., keep_vars: bool = ...) -> _D: ...
    @overload
    def state_dict(self, *, prefix: str = ..., keep_vars: bool = ...) -> dict[str, Tensor]: ...
    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        """The contract's names (CONTRACT.md, "state_dict names"); q/k/v are views of in_proj."""
        if args:
            raise TypeError("state_dict takes keyword arguments only")
        params = dict(self.named_parameters())
        out = {} if destination is None else destination
        for contract, (name, rows) in self._contract_views().items():
            p = params[name] if keep_vars else params[name].detach()
            out[prefix + contract] = p if rows is None else p[rows]
        return out

    def load_state_dict(
        self, state_dict: Mapping[str, Tensor], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load a contract-named state_dict; strict: missing or unexpected names raise."""
        if assign:
            raise ValueError("assign=True is not supported: q/k/v are rows of torch's in_proj")
        views = self._contract_views()
        missing = [k for k in views if k not in state_dict]
        unexpected = [k for k in state_dict if k not in views]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"Error(s) in loading state_dict for torch_copy.Transformer: "
                f"missing keys {missing}, unexpected keys {unexpected}"
            )
        params = dict(self.named_parameters())
        with torch.no_grad():
            for contract, (name, rows) in views.items():
                if contract not in state_dict:
                    continue
                target = params[name] if rows is None else params[name][rows]
                value = torch.as_tensor(state_dict[contract])
                if value.shape != target.shape:
                    raise RuntimeError(
                        f"{contract}: shape {tuple(value.shape)} in the state_dict, "
                        f"expected {tuple(target.shape)}"
                    )
                target.copy_(value)
        return nn.modules.module._IncompatibleKeys(missing, unexpected)


# --- training --------------------------------------------------------------------------------


def label_smoothed_loss(logits: Tensor, targets: Tensor, eps: float, pad_id: int) -> Tensor:
    """mean over non-pad targets of -sum_j q_j log p_j, q = (1 - eps) onehot(t) + eps / V.

    torch's cross_entropy with label_smoothing mixes in eps / V over every class and, with
    ignore_index, drops pad targets from both terms and from the mean's count: the contract's rule.
    """
    V = logits.shape[-1]
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets shape {tuple(targets.shape)} does not match logits {tuple(logits.shape)}"
        )
    return F.cross_entropy(
        logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=eps
    )


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """factor * d^-1/2 * min(n^-1/2, n * warmup^-3/2), n = step + 1 (paper, 5.3)."""
    if step < 0 or warmup < 1:
        raise ValueError(f"need step >= 0 and warmup >= 1, got step={step}, warmup={warmup}")
    n = step + 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def make_optimizer(model: nn.Module) -> torch.optim.Adam:
    """Adam with beta (0.9, 0.98), epsilon 1e-9, no weight decay (paper, 5.3)."""
    return torch.optim.Adam(
        model.parameters(), betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, foreach=True
    )


def fit(
    model: Transformer,
    src: Tensor,
    tgt: Tensor,
    steps: int,
    batch: int,
    pad_id: int,
    warmup: int = 4000,
    factor: float = 1.0,
    smoothing: float = 0.1,
    lr: float | None = None,
    seed: int = 0,
    callback: Callable[[int, float, float], None] | None = None,
) -> list[float]:
    """`steps` Adam updates with teacher forcing: read tgt[:, :-1], predict tgt[:, 1:].

    Batches come from shuffles drawn with `seed`; dropout draws from the global generator seeded
    with `seed` inside a fork, so the caller's random state is left as it was.
    """
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"batch sizes differ: src has {src.shape[0]} rows, tgt {tgt.shape[0]}")
    if steps < 0 or batch < 1:
        raise ValueError(f"need steps >= 0 and batch >= 1, got steps={steps}, batch={batch}")
    n_rows = src.shape[0]
    batch = min(batch, n_rows)
    optimizer = make_optimizer(model)
    shuffle = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    was_training = model.training
    model.train()
    losses: list[float] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for step in range(steps):
                if order.numel() < batch:  # an epoch ends; its tail shorter than a batch is dropped
                    order = torch.randperm(n_rows, generator=shuffle)
                rows, order = order[:batch], order[batch:]
                rate = lr if lr is not None else noam_rate(step, model.cfg.d_model, warmup, factor)
                for group in optimizer.param_groups:
                    group["lr"] = rate
                s, t = src[rows], tgt[rows]
                tgt_in, tgt_out = t[:, :-1], t[:, 1:]
                logits = model(s, tgt_in, s != pad_id, tgt_in != pad_id)
                loss = label_smoothed_loss(logits, tgt_out, smoothing, pad_id)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if callback is not None:
                    callback(step, rate, losses[-1])
    finally:
        model.train(was_training)
    return losses


# --- inference -------------------------------------------------------------------------------


def _beam_search(
    model: Transformer,
    memory: Tensor,
    src_mask: Tensor,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int,
    length_penalty: float,
) -> list[int]:
    """CONTRACT.md's pinned beam search for one source row (memory [1, S, d])."""
    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    state = model.init_state(src_mask)
    y_prev = torch.tensor([bos], device=memory.device)
    finished: list[tuple[float, tuple[int, ...]]] = []
    for _ in range(max_len):
        n_live = len(live)
        logits, state = model.decode_step(y_prev, memory.expand(n_live, -1, -1), state)
        logp = F.log_softmax(logits.double(), dim=-1)  # [n_live, V]
        # each hypothesis's beam_size best tokens, ties to the lower id (a stable sort)
        top_logp, top_tok = torch.sort(logp, dim=-1, descending=True, stable=True)
        candidates = [
            (live[i][1] + top_logp[i, r].item(), i, int(top_tok[i, r]))
            for i in range(n_live)
            for r in range(min(beam_size, logp.shape[1]))
        ]
        candidates.sort(key=lambda c: -c[0])  # stable: live order, then token rank
        next_live: list[tuple[tuple[int, ...], float]] = []
        parents: list[int] = []
        for total, i, tok in candidates:
            if len(next_live) == beam_size:
                break
            tokens = live[i][0] + (tok,)
            if tok == eos:
                finished.append((total / len(tokens) ** length_penalty, tokens))
            else:
                next_live.append((tokens, total))
                parents.append(i)
        if len(finished) >= beam_size or not next_live:
            break
        live = next_live
        state = state.select(torch.tensor(parents, device=memory.device))
        y_prev = torch.tensor([t[-1] for t, _ in live], device=memory.device)
    if not finished:  # max_len reached with nothing finished: the live hypotheses finish
        finished = [(logp_ / max(len(t), 1) ** length_penalty, t) for t, logp_ in live]
    best = max(range(len(finished)), key=lambda k: (finished[k][0], -k))
    answer = list(finished[best][1])
    return answer[:-1] if answer and answer[-1] == eos else answer


def translate(
    model: Transformer,
    src: Tensor,
    bos: int,
    eos: int,
    pad_id: int,
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Beam search per source row (CONTRACT.md, translate); beam_size=1 is greedy argmax."""
    if beam_size < 1 or max_len < 0:
        raise ValueError(f"need beam_size >= 1 and max_len >= 0, got {beam_size}, {max_len}")
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len {max_len} exceeds the model's max_len {model.cfg.max_len}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            src_mask = src != pad_id
            memory = model.encode(src, src_mask)
            return [
                _beam_search(
                    model,
                    memory[b : b + 1],
                    src_mask[b : b + 1],
                    bos,
                    eos,
                    max_len,
                    beam_size,
                    length_penalty,
                )
                for b in range(src.shape[0])
            ]
    finally:
        model.train(was_training)


# --- checkpoints -----------------------------------------------------------------------------


def save_transformer(model: Transformer, dir: str | os.PathLike[str]) -> None:
    """config.json (the config's fields) and model.safetensors in the contract's names."""
    os.makedirs(dir, exist_ok=True)
    with open(os.path.join(dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(model.cfg), f, indent=2)
    # q/k/v are views of one in_proj tensor: safetensors refuses shared storage, so copy them.
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(dir, "model.safetensors"))


def load_transformer(dir: str | os.PathLike[str]) -> Transformer:
    """The model save_transformer wrote, in the saved dtype and in eval mode."""
    with open(os.path.join(dir, "config.json")) as f:
        cfg = TransformerConfig(**json.load(f))
    tensors = load_file(os.path.join(dir, "model.safetensors"))
    model = Transformer(cfg)
    model.to(next(iter(tensors.values())).dtype)
    model.load_state_dict(tensors)
    return model.eval()
