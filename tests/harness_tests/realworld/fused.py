"""transformer.py: an encoder-decoder Transformer with nn.MultiheadAttention's parameter layout.

My attention keeps q, k and v in one fused projection (in_proj_weight [3d, d], in_proj_bias [3d])
plus out_proj, and the modules are laid out as torch's nn.Transformer lays them out
(encoder.layers.{i}, decoder.layers.{i}.multihead_attn, encoder.norm), so that torch checkpoints
load into it. Attention itself is written with einsum. state_dict() and load_state_dict() speak
the course's names (encoder.{i}.self_attn.q_proj.weight, ...): the attention splits its fused
projection when saving, and a hook on the model renames the rest.
"""

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn


@dataclass
class TransformerConfig:
    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_enc: int = 6
    n_dec: int = 6
    dropout: float = 0.1
    norm: str = "post"
    tie_embeddings: bool = True
    max_len: int = 256
    ln_eps: float = 1e-5


def sinusoid_table(length: int, d: int, dtype: torch.dtype) -> Tensor:
    pos = torch.arange(length, dtype=torch.float64)
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(pos, freq)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :d]  # interleaved
    return table.to(dtype)


class FusedAttention(nn.Module):
    """Multi-head attention with nn.MultiheadAttention's parameters, computed with einsum."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.h, self.d = n_heads, d_model
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.h, self.d // self.h))  # [B, L, h, d_k]

    def project(self, x: Tensor, which: slice) -> Tensor:
        w, b = self.in_proj_weight[which], self.in_proj_bias[which]
        return F.linear(x, w, b)

    def kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.project(x, slice(self.d, 3 * self.d)).chunk(2, dim=-1)
        return self.heads(k), self.heads(v)

    def forward(self, x, context=None, allowed=None, past=None, context_kv=None):
        """x [B, T, d] attends to context (x itself when None); allowed [B, T|1, S] (True =
        may attend). Returns the output and the (k, v) heads it attended to, for caching."""
        if context is None and context_kv is None:
            q, k, v = self._fused_split(x)  # self-attention: one fused projection
        else:
            q = self.heads(self.project(x, slice(0, self.d)))
            k, v = context_kv if context_kv is not None else self.kv(context)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
        scores = torch.einsum("bthe,bshe->bhts", q, k) / math.sqrt(self.d // self.h)
        if allowed is not None:
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        weights = self.attn_drop(scores.softmax(dim=-1))
        ctx = torch.einsum("bhts,bshe->bthe", weights, v).flatten(-2)
        return self.out_proj(ctx), (k, v)

    def _fused_split(self, x):
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        return self.heads(q), self.heads(k), self.heads(v)

    # checkpoints in the course's names: the fused projection is saved as q_proj, k_proj, v_proj
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        w = destination.pop(prefix + "in_proj_weight")
        b = destination.pop(prefix + "in_proj_bias")
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            destination[prefix + name + ".weight"] = w[i * self.d : (i + 1) * self.d]
            destination[prefix + name + ".bias"] = b[i * self.d : (i + 1) * self.d]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        parts = [prefix + n for n in ("q_proj", "k_proj", "v_proj")]
        if all(p + ".weight" in state_dict for p in parts):
            state_dict[prefix + "in_proj_weight"] = torch.cat(
                [state_dict.pop(p + ".weight") for p in parts]
            )
        if all(p + ".bias" in state_dict for p in parts):
            state_dict[prefix + "in_proj_bias"] = torch.cat(
                [state_dict.pop(p + ".bias") for p in parts]
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm_first = cfg.norm == "pre"
        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def ff(self, x):
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))

    def forward(self, x, allowed):
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), allowed=allowed)[0])
            x = x + self.ff(self.norm2(x))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, allowed=allowed)[0]))
            x = self.norm2(x + self.ff(x))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm_first = cfg.norm == "pre"
        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.multihead_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def ff(self, x):
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))

    def forward(self, y, memory, self_allowed, mem_allowed, cache=None):
        """cache: (self-attention k/v of earlier positions, memory k/v) or None."""
        past, mem_kv = cache if cache is not None else (None, None)
        if self.norm_first:
            a, self_kv = self.self_attn(self.norm1(y), allowed=self_allowed, past=past)
            y = y + self.dropout(a)
            c, mem_kv = self.multihead_attn(self.norm2(y), memory, mem_allowed, context_kv=mem_kv)
            y = y + self.dropout(c)
            y = y + self.ff(self.norm3(y))
        else:
            a, self_kv = self.self_attn(y, allowed=self_allowed, past=past)
            y = self.norm1(y + self.dropout(a))
            c, mem_kv = self.multihead_attn(y, memory, mem_allowed, context_kv=mem_kv)
            y = self.norm2(y + self.dropout(c))
            y = self.norm3(y + self.ff(y))
        return y, (self_kv, mem_kv)


class Encoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.n_enc)])
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None

    def forward(self, x, allowed):
        for layer in self.layers:
            x = layer(x, allowed)
        return x if self.norm is None else self.norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.n_dec)])
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None

    def forward(self, y, memory, self_allowed, mem_allowed, caches=None):
        new_caches = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            y, c = layer(y, memory, self_allowed, mem_allowed, cache)
            new_caches.append(c)
        return (y if self.norm is None else self.norm(y)), tuple(new_caches)


# torch's module names -> the course's checkpoint names (and back)
TO_COURSE = [
    (r"^(encoder|decoder)\.layers\.(\d+)\.", r"\1.\2."),
    (r"\.multihead_attn\.", ".cross_attn."),
    (r"^encoder\.norm\.", "enc_norm."),
    (r"^decoder\.norm\.", "dec_norm."),
]
TO_TORCH = [
    (r"^(encoder|decoder)\.(\d+)\.", r"\1.layers.\2."),
    (r"\.cross_attn\.", ".multihead_attn."),
    (r"^enc_norm\.", "encoder.norm."),
    (r"^dec_norm\.", "decoder.norm."),
]


def rename(key: str, rules) -> str:
    for pattern, repl in rules:
        key = re.sub(pattern, repl, key)
    return key


def _course_names(module, state_dict, prefix, local_metadata):
    items = list(state_dict.items())
    state_dict.clear()
    for k, v in items:
        if k.startswith(prefix):
            k = prefix + rename(k[len(prefix) :], TO_COURSE)
        state_dict[k] = v
    return state_dict


def _torch_names(state_dict, prefix, *args):
    for k in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + rename(k[len(prefix) :], TO_TORCH)] = state_dict.pop(k)


@dataclass(frozen=True)
class DecodeState:
    pos: int
    src_mask: Tensor
    caches: tuple | None = field(default=None)  # per layer ((k, v) so far, memory (k, v))


def _check(ids, mask, what, max_len):
    if not torch.is_tensor(mask) or mask.dtype is not torch.bool:
        raise TypeError(f"{what} mask must be torch.bool")
    if mask.shape != ids.shape:
        raise ValueError(f"{what} mask {tuple(mask.shape)} does not match {tuple(ids.shape)}")
    if ids.shape[-1] > max_len:
        raise ValueError(f"{what} longer than max_len {max_len}")


def _check_src(src_mask):
    if not torch.is_tensor(src_mask) or src_mask.dtype is not torch.bool:
        raise TypeError("src mask must be torch.bool")
    if (~src_mask).all(dim=-1).any():
        raise ValueError("every source row needs at least one real token")


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        if cfg.norm not in ("post", "pre"):
            raise ValueError(f"unknown norm {cfg.norm!r}")
        self.cfg = cfg
        d = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        self.tgt_emb = (
            None if cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
            else nn.Embedding(cfg.tgt_vocab, d)
        )
        self.out = None if cfg.tie_embeddings else nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        for m in (self.src_emb, self.tgt_emb, self.out):
            if m is not None:
                nn.init.normal_(m.weight, std=d**-0.5)
        self._register_state_dict_hook(_course_names)
        self._register_load_state_dict_pre_hook(_torch_names)

    def _table(self):
        return self.src_emb.weight if self.tgt_emb is None else self.tgt_emb.weight

    def _embed(self, ids, table, offset=0):
        d = self.cfg.d_model
        x = table[ids] * math.sqrt(d)
        pe = sinusoid_table(offset + ids.shape[1], d, x.dtype)[offset:]
        return self.drop(x + pe.to(x.device))

    def _logits(self, y):
        if self.out is not None:
            return self.out(y)
        return torch.einsum("btd,vd->btv", y, self._table())

    def encode(self, src, src_mask):
        _check(src, src_mask, "src", self.cfg.max_len)
        _check_src(src_mask)
        return self.encoder(self._embed(src, self.src_emb.weight), src_mask[:, None, :])

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        _check(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        _check_src(src_mask)
        B, T = tgt_in.shape
        if memory.shape[0] != B or memory.shape[:2] != src_mask.shape:
            raise ValueError(f"memory {tuple(memory.shape)} does not fit src_mask / tgt_in")
        if not bool(tgt_mask[:, 0].all()):
            raise ValueError("target rows must start with bos, not padding")
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), diagonal=0)
        allowed = causal[None] & tgt_mask[:, None, :]
        y, _ = self.decoder(self._embed(tgt_in, self._table()), memory, allowed, src_mask[:, None])
        return self._logits(y)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"batch sizes differ: {src.shape[0]} vs {tgt_in.shape[0]}")
        memory = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask, tgt_mask)

    def init_state(self, src_mask):
        _check_src(src_mask)
        return DecodeState(0, src_mask, None)

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.shape != (state.src_mask.shape[0],):
            raise ValueError(f"y_prev must have shape [B], got {tuple(y_prev.shape)}")
        if state.pos >= self.cfg.max_len:
            raise ValueError("decoding past max_len")
        y = self._embed(y_prev[:, None], self._table(), offset=state.pos)
        y, caches = self.decoder(y, memory, None, state.src_mask[:, None], state.caches)
        return self._logits(y)[:, 0], DecodeState(state.pos + 1, state.src_mask, caches)


def label_smoothed_loss(logits, targets, eps, pad_id):
    V = logits.shape[-1]
    logp = logits.log_softmax(-1).reshape(-1, V)
    t = targets.reshape(-1)
    keep = t != pad_id
    logp, t = logp[keep], t[keep]
    nll = -logp[torch.arange(len(t)), t]
    smooth = -logp.sum(-1) / V
    return ((1 - eps) * nll + eps * smooth).mean()


def noam_rate(step, d_model, warmup, factor=1.0):
    n = step + 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, weight_decay=0)


def fit(
    model,
    src,
    tgt,
    steps,
    batch,
    pad_id,
    warmup=4000,
    factor=1.0,
    smoothing=0.1,
    lr=None,
    seed=0,
    callback=None,
):
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src has {src.shape[0]} rows, tgt {tgt.shape[0]}")
    g = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model)
    mode = model.training
    model.train()
    losses = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        perm, at = torch.randperm(len(src), generator=g), 0
        for step in range(steps):
            if at >= len(perm):
                perm, at = torch.randperm(len(src), generator=g), 0
            rows = perm[at : at + batch]
            at += batch
            x, y = src[rows], tgt[rows]
            inp, gold = y[:, :-1], y[:, 1:]
            loss = label_smoothed_loss(model(x, inp, x != pad_id, inp != pad_id), gold,
                                       smoothing, pad_id)
            rate = noam_rate(step, model.cfg.d_model, warmup, factor) if lr is None else lr
            for group in opt.param_groups:
                group["lr"] = rate
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            if callback is not None:
                callback(step, rate, losses[-1])
    model.train(mode)
    return losses


def _beam(model, memory, src_mask, bos, eos, max_len, k, alpha):
    live = [([], 0.0, model.init_state(src_mask))]
    done = []
    for _ in range(max_len):
        cands = []
        for toks, lp, st in live:
            prev = torch.tensor([toks[-1] if toks else bos])
            logits, nxt = model.decode_step(prev, memory, st)
            logp = torch.log_softmax(logits[0], dim=-1)
            order = torch.argsort(logp, descending=True, stable=True)[:k]
            cands += [(lp + logp[j].item(), toks + [int(j)], nxt) for j in order]
        cands.sort(key=lambda c: -c[0])
        live = []
        for lp, toks, st in cands:
            if toks[-1] == eos:
                done.append((lp / len(toks) ** alpha, toks))
            else:
                live.append((toks, lp, st))
                if len(live) == k:
                    break
        if len(done) >= k or not live:
            break
    if not done:
        done = [(lp / len(toks) ** alpha, toks) for toks, lp, _ in live]
    best_score, best = done[0]
    for score, toks in done[1:]:
        if score > best_score:
            best_score, best = score, toks
    return best[:-1] if best[-1] == eos else best


def translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0):
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len={max_len} is above the model's {model.cfg.max_len}")
    mode = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = []
            for row in src:
                s, m = row[None], (row != pad_id)[None]
                memory = model.encode(s, m)
                out.append(_beam(model, memory, m, bos, eos, max_len, beam_size, length_penalty))
            return out
    finally:
        model.train(mode)


def save_transformer(model, dir):
    Path(dir).mkdir(parents=True, exist_ok=True)
    with open(Path(dir) / "config.json", "w") as f:
        json.dump(asdict(model.cfg), f)
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(Path(dir) / "model.safetensors"))


def load_transformer(dir):
    with open(Path(dir) / "config.json") as f:
        cfg = TransformerConfig(**json.load(f))
    tensors = load_file(str(Path(dir) / "model.safetensors"))
    model = Transformer(cfg).to(next(iter(tensors.values())).dtype)
    model.load_state_dict(tensors)
    return model
