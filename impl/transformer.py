"""The encoder-decoder Transformer of Vaswani et al. 2017 in torch: the contract's reference.

One self-contained file (stdlib, torch and safetensors only) so that it can be read top to bottom,
copied, and patched. CONTRACT.md says what every name here must do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from os import PathLike
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn


@dataclass
class TransformerConfig:
    src_vocab: int  # source ids are 0 .. src_vocab - 1
    tgt_vocab: int  # target ids and output logits: 0 .. tgt_vocab - 1
    d_model: int = 512  # the residual stream's width, d in the paper
    n_heads: int = 8  # h; each head reads d_k = d_model / n_heads features
    d_ff: int = 2048  # the feed-forward's hidden width (4d in the paper)
    n_enc: int = 6  # encoder layers, N
    n_dec: int = 6  # decoder layers, N
    dropout: float = 0.1  # P_drop of section 5.4, on every site the paper lists plus the weights
    norm: str = "post"  # 'post': LN(x + F(x)) as in the paper; 'pre': x + F(LN(x)) (Xiong et al.)
    tie_embeddings: bool = True  # one table for source, target and output where shapes allow
    max_len: int = 256  # longest sequence accepted, so positions stay where PE was checked
    ln_eps: float = 1e-5  # LayerNorm epsilon, torch's default

    def __post_init__(self) -> None:
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("n_enc", "n_dec"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if not self.ln_eps > 0.0:
            raise ValueError(f"ln_eps must be positive, got {self.ln_eps}")

    @classmethod
    def of(cls, cfg: object) -> TransformerConfig:
        """This module's config from any object (or dict) carrying the contract's fields."""
        if isinstance(cfg, cls):
            return cfg
        get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name)
        return cls(**{f.name: get(f.name) for f in fields(cls)})  # type: ignore[arg-type]  # dict.get: None for a missing field


def positional_encoding(start: int, length: int, d_model: int, dtype, device) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (section 3.5).

    Built in float64 for positions start .. start + length - 1 at every call, then cast: a stored
    float32 table cast up by .double() would sit ~1e-8 away from the float64 values.
    """
    p = torch.arange(start, start + length, dtype=torch.float64, device=device)[:, None]  # [T, 1]
    feature = torch.arange(d_model, device=device)
    two_i = (feature - feature % 2).to(torch.float64)  # 2i for both features 2i and 2i+1
    angle = p / 10000.0 ** (two_i / d_model)  # [T, d]
    return torch.where(feature % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + mask) V per head, heads concatenated, then out_proj (3.2.2)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.d_k = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)  # on the attention weights

    def forward(self, query: Tensor, key_value: Tensor, mask: Tensor | None) -> Tensor:
        """query [B, T, d] reads key_value [B, S, d]; mask [B|1, 1, T|1, S], True = readable."""
        k, v = self.keys_values(key_value)
        return self.attend(query, k, v, mask)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The projected keys and values of x [B, S, d], each [B, h, S, d_k]: what a cache holds."""
        return self._split_heads(self.k_proj(x)), self._split_heads(self.v_proj(x))

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """query [B, T, d] against projected keys and values [B, h, S, d_k] -> [B, T, d]."""
        B, T, C = query.shape
        q = self._split_heads(self.q_proj(query))  # [B, h, T, d_k]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, h, T, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = self.dropout(torch.softmax(scores, dim=-1))
        heads = weights @ v  # [B, h, T, d_k]
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, C))  # heads in order, [B, T, d]

    def _split_heads(self, x: Tensor) -> Tensor:
        B, S, _ = x.shape
        return x.view(B, S, self.n_heads, self.d_k).transpose(1, 2)  # [B, h, S, d_k]


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each inside a residual with its LayerNorm (3.1)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        # x: [B, S, d]; mask: [B, 1, 1, S], the source padding
        if self.pre_norm:
            x = x + self._sa_block(self.norm1(x), mask)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, mask))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.dropout(self.self_attn(x, x, mask))

    def _ff_block(self, x: Tensor) -> Tensor:
        """FF(x) = W_2 relu(W_1 x + b_1) + b_2 (3.3)."""
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, feed-forward (3.1)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, y: Tensor, memory: Tensor, self_mask: Tensor, cross_mask: Tensor) -> Tensor:
        # y: [B, T, d]; memory: [B, S, d]; self_mask: [B, 1, T, T]; cross_mask: [B, 1, 1, S]
        if self.pre_norm:
            y = y + self._sa_block(self.norm1(y), self_mask)
            y = y + self._ca_block(self.norm2(y), memory, cross_mask)
            y = y + self._ff_block(self.norm3(y))
        else:
            y = self.norm1(y + self._sa_block(y, self_mask))
            y = self.norm2(y + self._ca_block(y, memory, cross_mask))
            y = self.norm3(y + self._ff_block(y))
        return y

    def step(
        self,
        y_t: Tensor,
        past: tuple[Tensor, Tensor],
        cross_kv: tuple[Tensor, Tensor],
        cross_mask: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """forward for one new position t, reading cached keys and values instead of the prefix.

        y_t [B, 1, d]; past: self-attention K/V of positions < t, each [B, h, t, d_k];
        cross_kv: the encoder output's K/V. Returns y_t and the K/V of positions <= t.
        """
        h_t = self.norm1(y_t) if self.pre_norm else y_t  # what self-attention reads at t
        k_t, v_t = self.self_attn.keys_values(h_t)  # [B, h, 1, d_k]
        kv = (
            torch.cat([past[0], k_t], dim=2),
            torch.cat([past[1], v_t], dim=2),
        )  # [B, h, t+1, d_k]
        a_t = self.dropout(self.self_attn.attend(h_t, *kv, None))  # every cached position is <= t
        if self.pre_norm:
            y_t = y_t + a_t
            y_t = y_t + self.dropout(self.cross_attn.attend(self.norm2(y_t), *cross_kv, cross_mask))
            y_t = y_t + self._ff_block(self.norm3(y_t))
        else:
            y_t = self.norm1(y_t + a_t)
            y_t = self.norm2(y_t + self.dropout(self.cross_attn.attend(y_t, *cross_kv, cross_mask)))
            y_t = self.norm3(y_t + self._ff_block(y_t))
        return y_t, kv

    def _sa_block(self, y: Tensor, mask: Tensor) -> Tensor:
        return self.dropout(self.self_attn(y, y, mask))

    def _ca_block(self, y: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        return self.dropout(self.cross_attn(y, memory, mask))  # keys and values: the encoder's

    def _ff_block(self, y: Tensor) -> Tensor:
        """FF(y) = W_2 relu(W_1 y + b_1) + b_2 (3.3)."""
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(y)))))


@dataclass(frozen=True)
class DecodeState:
    """Where incremental decoding stands; decode_step returns a new one and never edits this."""

    pos: int  # the position of the next y_prev (0: bos)
    src_mask: Tensor  # [B, S], True = a real source token
    self_kv: tuple[tuple[Tensor, Tensor], ...]  # per decoder layer: K/V of positions < pos
    cross_kv: tuple[tuple[Tensor, Tensor], ...] | None  # per layer: the memory's K/V, from step 0


class Transformer(nn.Module):
    """Encoder-decoder Transformer (section 3), post-LN or pre-LN."""

    def __init__(self, cfg: object) -> None:
        super().__init__()
        cfg = TransformerConfig.of(cfg)
        self.cfg = cfg
        d = cfg.d_model
        share_all = cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        self.tgt_emb = None if share_all else nn.Embedding(cfg.tgt_vocab, d)
        self.out = None if cfg.tie_embeddings else nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None
        self.dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None
        self.dropout = nn.Dropout(cfg.dropout)
        for table in (self.src_emb, self.tgt_emb, self.out):
            if table is not None:
                nn.init.normal_(table.weight, mean=0.0, std=d**-0.5)  # E * sqrt(d) has unit scale

    def tgt_table(self) -> Tensor:
        """The target embedding table [V_tgt, d] (the source's when tied, vocabularies equal)."""
        return self.src_emb.weight if self.tgt_emb is None else self.tgt_emb.weight

    def out_weight(self) -> Tensor:
        """The output layer's W_out [V_tgt, d] (the target table when tied)."""
        return self.tgt_table() if self.out is None else self.out.weight

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        _check_batches(src=src, tgt_in=tgt_in)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src [B, S] -> memory [B, S, d]."""
        self._check_source(src, src_mask)
        x = self._embed(src, self.src_emb.weight)  # [B, S, d]
        enc_self_mask = src_mask[:, None, None, :]  # [B, 1, 1, S]: source padding
        for layer in self.encoder:
            x = layer(x, enc_self_mask)
        if self.cfg.norm == "pre":
            x = self.enc_norm(x)
        return x

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """tgt_in [B, T] reading memory [B, S, d] -> logits [B, T, V_tgt]."""
        self._check_target(tgt_in, tgt_mask)
        self._check_memory(memory, src_mask)
        _check_batches(tgt_in=tgt_in, memory=memory)
        B, T = tgt_in.shape
        y = self._embed(tgt_in, self.tgt_table())  # [B, T, d]
        causal = torch.ones(T, T, dtype=torch.bool, device=y.device).tril()  # key j <= query t
        dec_self_mask = causal & tgt_mask[:, None, None, :]  # [B, 1, T, T]
        cross_mask = src_mask[:, None, None, :]  # [B, 1, 1, S]: source padding
        for layer in self.decoder:
            y = layer(y, memory, dec_self_mask, cross_mask)
        return self._logits(y)

    def init_state(self, src_mask: Tensor) -> DecodeState:
        """The state before bos: empty self-attention caches, cross K/V still to compute."""
        _check_mask(src_mask, "src_mask")
        if src_mask.dim() != 2:
            raise ValueError(f"src_mask must be [B, S], got shape {tuple(src_mask.shape)}")
        _check_rows_have_tokens(src_mask)
        p = self.src_emb.weight
        h, d_k = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        empty = p.new_zeros(src_mask.size(0), h, 0, d_k)  # [B, h, 0, d_k]
        return DecodeState(0, src_mask, tuple((empty, empty) for _ in self.decoder), None)

    def decode_step(
        self, y_prev: Tensor, memory: Tensor, state: DecodeState
    ) -> tuple[Tensor, DecodeState]:
        """y_prev [B], the token at position state.pos -> (logits [B, V_tgt] there, next state)."""
        self._check_memory(memory, state.src_mask)
        if y_prev.dim() != 1 or y_prev.size(0) != state.src_mask.size(0):
            raise ValueError(
                f"y_prev must be [B] with B={state.src_mask.size(0)} like the state, "
                f"got shape {tuple(y_prev.shape)}"
            )
        t = state.pos
        if t >= self.cfg.max_len:
            raise ValueError(f"position {t} is past max_len={self.cfg.max_len}")
        y_t = self._embed(y_prev[:, None], self.tgt_table(), start=t)  # [B, 1, d]
        cross_kv = state.cross_kv
        if cross_kv is None:  # the first step: project the encoder's output once
            cross_kv = tuple(layer.cross_attn.keys_values(memory) for layer in self.decoder)  # type: ignore[operator,union-attr]  # torch: ModuleList items are Module
        step_cross_mask = state.src_mask[:, None, None, :]  # [B, 1, 1, S]
        self_kv = []
        for layer, past, layer_cross_kv in zip(self.decoder, state.self_kv, cross_kv, strict=True):
            y_t, kv = layer.step(y_t, past, layer_cross_kv, step_cross_mask)  # type: ignore[operator]  # torch: ModuleList items are Module
            self_kv.append(kv)
        logits = self._logits(y_t)[:, 0]  # [B, V_tgt]
        return logits, DecodeState(t + 1, state.src_mask, tuple(self_kv), cross_kv)

    def _embed(self, ids: Tensor, table: Tensor, start: int = 0) -> Tensor:
        """x0 = E[ids] * sqrt(d) + PE at positions start.. (3.4, 3.5), then dropout."""
        x = F.embedding(ids, table) * math.sqrt(self.cfg.d_model)  # [B, T, d]
        x = x + positional_encoding(start, ids.size(1), self.cfg.d_model, x.dtype, x.device)
        return self.dropout(x)

    def _logits(self, y: Tensor) -> Tensor:
        """[.., d] -> [.., V_tgt]: the final LN (pre-LN only), then y W_out^T."""
        if self.cfg.norm == "pre":
            y = self.dec_norm(y)
        return F.linear(y, self.out_weight())

    def _check_source(self, src: Tensor, src_mask: Tensor) -> None:
        _check_ids_and_mask(src, src_mask, "src", self.cfg.max_len)
        _check_rows_have_tokens(src_mask)

    def _check_target(self, tgt_in: Tensor, tgt_mask: Tensor) -> None:
        _check_ids_and_mask(tgt_in, tgt_mask, "tgt_in", self.cfg.max_len)
        if tgt_in.size(1) == 0:
            raise ValueError("tgt_in is empty: it must start with bos")
        padded = (~tgt_mask[:, 0]).nonzero().flatten().tolist()
        if padded:
            raise ValueError(f"target rows {padded} have padding at position 0, where bos must be")

    def _check_memory(self, memory: Tensor, src_mask: Tensor) -> None:
        _check_mask(src_mask, "src_mask")
        expected = (*src_mask.shape, self.cfg.d_model)
        if tuple(memory.shape) != expected:
            raise ValueError(
                f"memory has shape {tuple(memory.shape)}, expected {expected} from src_mask"
            )
        _check_rows_have_tokens(src_mask)


def _check_mask(mask: Tensor, name: str) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool tensor (True = a real token), got {got}")


def _check_ids_and_mask(ids: Tensor, mask: Tensor, name: str, max_len: int) -> None:
    _check_mask(mask, f"{name}'s mask")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must be [B, length], got shape {tuple(ids.shape)}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{name}'s mask has shape {tuple(mask.shape)}, expected {tuple(ids.shape)} like {name}"
        )
    if ids.size(1) > max_len:
        raise ValueError(f"{name} has length {ids.size(1)}, longer than max_len={max_len}")


def _check_rows_have_tokens(src_mask: Tensor) -> None:
    empty = (~src_mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"source rows {empty} have no real token: nothing to attend to")


def _check_batches(**tensors: Tensor) -> None:
    sizes = {name: t.size(0) for name, t in tensors.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"batch sizes differ: {sizes}")


def label_smoothed_loss(logits: Tensor, targets: Tensor, eps: float, pad_id: int) -> Tensor:
    """mean over non-pad targets of -sum_j q_j log p_j, q = (1 - eps) onehot(t) + eps / V (7.5)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocab axis"
        )
    logp = torch.log_softmax(logits, dim=-1)  # [N.., V]
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # -log p_t, [N..]
    uniform = -logp.mean(dim=-1)  # mean_j -log p_j, [N..]
    per_target = (1.0 - eps) * nll + eps * uniform
    real = targets != pad_id
    n_real = real.sum()
    if n_real == 0:
        raise ValueError(f"every target is the pad id {pad_id}: the mean is over nothing")
    return torch.where(real, per_target, torch.zeros_like(per_target)).sum() / n_real


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """factor * d^-1/2 * min(n^-1/2, n * warmup^-3/2), update s at n = s + 1 (section 5.3)."""
    if step < 0 or warmup < 1:
        raise ValueError(f"need step >= 0 and warmup >= 1, got step={step}, warmup={warmup}")
    n = step + 1  # the paper counts updates from 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def make_optimizer(model: Transformer) -> torch.optim.Adam:
    """Adam with beta = (0.9, 0.98), eps = 1e-9, no weight decay (5.3); fit sets the rate."""
    first_rate = noam_rate(0, model.cfg.d_model, 4000)  # the paper's first update
    return torch.optim.Adam(
        model.parameters(),
        lr=first_rate,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=0.0,
        foreach=True,  # one multi-tensor update: faster than a loop over tensors on the CPU
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
    """`steps` Adam updates with teacher forcing on (src, tgt); returns each update's loss.

    Rows of tgt are bos, y1..yT, eos, then pad. Batches walk epochs of a shuffle drawn from
    `seed` (an epoch's last batch may be smaller); dropout is drawn from `seed` too, so the same
    seed and initial weights give the same losses.
    """
    if steps < 0 or batch < 1:
        raise ValueError(f"need steps >= 0 and batch >= 1, got steps={steps}, batch={batch}")
    _check_batches(src=src, tgt=tgt)
    device = next(model.parameters()).device
    src, tgt = src.to(device), tgt.to(device)
    optimizer = make_optimizer(model)
    shuffle = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    losses: list[float] = []
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for step in range(steps):
                if order.numel() == 0:  # a new epoch
                    order = torch.randperm(src.size(0), generator=shuffle)
                rows, order = order[:batch].to(device), order[batch:]
                s, t = src[rows], tgt[rows]
                tgt_in, tgt_out = t[:, :-1], t[:, 1:]
                logits = model(s, tgt_in, s != pad_id, tgt_in != pad_id)
                loss = label_smoothed_loss(logits, tgt_out, smoothing, pad_id)
                rate = lr if lr is not None else noam_rate(step, model.cfg.d_model, warmup, factor)
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if callback is not None:
                    callback(step, rate, losses[-1])
    finally:
        model.train(was_training)
    return losses


@torch.no_grad()
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
    """Each source row's best output under the beam search pinned in CONTRACT.md, without eos."""
    if beam_size < 1 or max_len < 1:
        raise ValueError(f"need beam_size >= 1 and max_len >= 1, got {beam_size}, {max_len}")
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len={max_len} is past the model's max_len={model.cfg.max_len}")
    if src.dim() != 2:
        raise ValueError(f"src must be [B, S], got shape {tuple(src.shape)}")
    src = src.to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        return [
            _beam_search(
                model, row[None], row[None] != pad_id, bos, eos, max_len, beam_size, length_penalty
            )
            for row in src
        ]
    finally:
        model.train(was_training)


def _beam_search(
    model: Transformer,
    src: Tensor,
    src_mask: Tensor,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int,
    length_penalty: float,
) -> list[int]:
    """The pinned beam search over one source row src [1, S]."""
    memory = model.encode(src, src_mask)  # [1, S, d]
    live = [((), 0.0, model.init_state(src_mask))]  # type: list[tuple[tuple, float, DecodeState]]  # (tokens, log p, state)
    finished = []  # (tokens ending in eos, score)
    for _ in range(max_len):
        candidates = []
        for tokens, logp, state in live:
            y_prev = torch.tensor([tokens[-1] if tokens else bos], device=memory.device)
            logits, next_state = model.decode_step(y_prev, memory, state)
            log_probs = torch.log_softmax(logits[0], dim=-1)  # [V_tgt]
            ranked = torch.sort(log_probs, descending=True, stable=True).indices[:beam_size]
            for token in ranked.tolist():
                candidates.append((tokens + (token,), logp + log_probs[token].item(), next_state))
        candidates.sort(key=lambda c: -c[1])  # stable: live order, then token rank
        live = []
        for tokens, logp, state in candidates:
            if tokens[-1] == eos:
                finished.append((tokens, logp / len(tokens) ** length_penalty))
            else:
                live.append((tokens, logp, state))
                if len(live) == beam_size:
                    break
        if len(finished) >= beam_size or not live:
            break
    if not finished:
        finished = [(tokens, logp / len(tokens) ** length_penalty) for tokens, logp, _ in live]
    best, best_score = finished[0]
    for tokens, score in finished[1:]:
        if score > best_score:  # strictly: the first of equal scores wins
            best, best_score = tokens, score
    return list(best[:-1]) if best[-1] == eos else list(best)


def save_transformer(model: Transformer, dir: str | PathLike[str]) -> None:
    """dir/config.json (the config's fields) and dir/model.safetensors (a tied tensor once)."""
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(asdict(model.cfg), indent=2) + "\n")
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"))


def load_transformer(dir: str | PathLike[str]) -> Transformer:
    """The model save_transformer wrote, in the float dtype it was saved in."""
    path = Path(dir)
    cfg = TransformerConfig(**json.loads((path / "config.json").read_text()))
    tensors = load_file(str(path / "model.safetensors"))
    model = Transformer(cfg).to(next(iter(tensors.values())).dtype)
    model.load_state_dict(tensors, strict=True)
    return model
