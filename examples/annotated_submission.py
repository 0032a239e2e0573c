"""transformer.py for the course contract, written after "The Annotated Transformer" notebook.

Habits kept from the notebook: clones() for the stacks, a hand-written LayerNorm, a
PositionalEncoding module that owns the embedding dropout, a Generator for the output layer, and
the residual connection living with the sublayer: here the attention module does the whole
sublayer itself, LN(x + attn(x)) in post-LN and x + attn(LN(x)) in pre-LN, with the layer's own
norm (encoder.{i}.norm1 ...) handed to it, so the state_dict keeps the contract's names.

examples/annotated_submission.py: this layout is correct; the one fault, marked
FAULT below, is further on: the encoder layers' norm2 does not get cfg.ln_eps.
"""

import copy
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn


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

    def __post_init__(self):
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', not {self.norm!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError("d_model must be a multiple of n_heads")


def clones(module, N):
    "Produce N identical layers."
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.Module):
    "Construct a layernorm module (see citation for details)."

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value)


class MultiHeadedAttention(nn.Module):
    """Multi-head attention as a whole sublayer: residual and LayerNorm included."""

    def __init__(self, h, d_model, dropout, pre_norm):
        super().__init__()
        self.d_k = d_model // h
        self.h = h
        self.pre_norm = pre_norm
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def split(self, x):
        nbatches = x.size(0)
        return x.view(nbatches, -1, self.h, self.d_k).transpose(1, 2)

    def keys_values(self, x):
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def forward(self, x, norm, mask=None, memory=None, past=None, memory_kv=None):
        """post: norm(x + attn(x)); pre: x + attn(norm(x)). Returns it and the keys/values read.

        memory: cross-attention reads it (or its cached keys/values memory_kv) instead of x;
        past: the cached keys/values of earlier positions, for self-attention step by step.
        """
        h = norm(x) if self.pre_norm else x
        if memory_kv is not None:
            k, v = memory_kv
        else:
            k, v = self.keys_values(h if memory is None else memory)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is not None:
            mask = mask.unsqueeze(1)  # same mask for every head
        q = self.split(self.q_proj(h))
        out = attention(q, k, v, mask=mask, dropout=self.dropout)
        out = out.transpose(1, 2).contiguous().view(x.size(0), -1, self.h * self.d_k)
        out = self.dropout(self.out_proj(out))
        if self.pre_norm:
            return x + out, (k, v)
        return norm(x + out), (k, v)


def residual(x, sublayer, norm, pre_norm, dropout):
    "The SublayerConnection of the notebook, for the feed-forward sublayer."
    if pre_norm:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


def feed_forward(layer, x):
    "FFN(x) = max(0, xW1 + b1)W2 + b2"
    return layer.linear2(layer.dropout(F.relu(layer.linear1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadedAttention(cfg.n_heads, cfg.d_model, cfg.dropout, self.pre_norm)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = LayerNorm(cfg.d_model)  # FAULT: cfg.ln_eps not passed (1e-6)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask):
        x, _ = self.self_attn(x, self.norm1, mask)
        return residual(x, lambda z: feed_forward(self, z), self.norm2, self.pre_norm, self.dropout)


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        args = (cfg.n_heads, cfg.d_model, cfg.dropout, self.pre_norm)
        self.self_attn = MultiHeadedAttention(*args)
        self.cross_attn = MultiHeadedAttention(*args)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.norm1 = LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm3 = LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, memory, src_mask, tgt_mask, past=None, memory_kv=None):
        x, self_kv = self.self_attn(x, self.norm1, tgt_mask, past=past)
        x, cross_kv = self.cross_attn(x, self.norm2, src_mask, memory=memory, memory_kv=memory_kv)
        x = residual(x, lambda z: feed_forward(self, z), self.norm3, self.pre_norm, self.dropout)
        return x, self_kv, cross_kv


class PositionalEncoding(nn.Module):
    "Implement the PE function."

    def __init__(self, d_model, dropout, max_len):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        position = torch.arange(0, max_len, dtype=torch.float64).unsqueeze(1)
        div_term = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model)
        )
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)[:, : d_model // 2]
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x, start=0):
        x = x + self.pe[start : start + x.size(1)].to(x.dtype)
        return self.dropout(x)


class Generator(nn.Linear):
    "Define standard linear generation step (logits; the loss takes the log_softmax)."

    def __init__(self, d_model, vocab):
        super().__init__(d_model, vocab, bias=False)


@dataclass(frozen=True)
class DecodeState:
    pos: int
    src_mask: torch.Tensor  # [B, S]
    self_kv: tuple  # per layer (k, v) [B, h, pos, d_k]
    cross_kv: tuple  # per layer (k, v) of memory, or None before the first step

    def select(self, rows):
        pick = lambda kv: (kv[0][rows], kv[1][rows])  # noqa: E731
        cross = None if self.cross_kv is None else tuple(pick(kv) for kv in self.cross_kv)
        return DecodeState(
            self.pos, self.src_mask[rows], tuple(pick(kv) for kv in self.self_kv), cross
        )


def check_mask(ids, mask, name, max_len):
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} mask must be a bool tensor")
    if ids.shape != mask.shape:
        raise ValueError(f"{name} mask shape {tuple(mask.shape)} != ids {tuple(ids.shape)}")
    if ids.size(1) > max_len:
        raise ValueError(f"{name} is longer than max_len={max_len}")


def check_src_mask(src_mask):
    if not isinstance(src_mask, torch.Tensor) or src_mask.dtype != torch.bool:
        raise TypeError("src_mask must be a bool tensor")
    if not src_mask.any(dim=-1).all():
        raise ValueError("a source row has no real token")


class Transformer(nn.Module):
    """A standard Encoder-Decoder architecture."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        self.share_all = cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
        if not self.share_all:
            self.tgt_emb = nn.Embedding(cfg.tgt_vocab, d)
        if not cfg.tie_embeddings:
            self.out = Generator(d, cfg.tgt_vocab)
        self.encoder = clones(EncoderLayer(cfg), cfg.n_enc)
        self.decoder = clones(DecoderLayer(cfg), cfg.n_dec)
        if cfg.norm == "pre":
            self.enc_norm = LayerNorm(d, eps=cfg.ln_eps)
            self.dec_norm = LayerNorm(d, eps=cfg.ln_eps)
        self.pos = PositionalEncoding(d, cfg.dropout, cfg.max_len)
        # Initialize parameters with Glorot / fan_avg, the tables with N(0, 1/d).
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for name, p in self.named_parameters():
            if name.endswith("emb.weight") or name == "out.weight":
                nn.init.normal_(p, mean=0.0, std=d**-0.5)

    def tgt_table(self):
        return self.src_emb.weight if self.share_all else self.tgt_emb.weight

    def embed(self, ids, table, start=0):
        return self.pos(F.embedding(ids, table) * math.sqrt(self.cfg.d_model), start)

    def generate(self, x):
        if self.cfg.norm == "pre":
            x = self.dec_norm(x)
        weight = self.out.weight if not self.cfg.tie_embeddings else self.tgt_table()
        return F.linear(x, weight)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        "Take in and process masked src and target sequences."
        if src.size(0) != tgt_in.size(0):
            raise ValueError("src and tgt_in have different batch sizes")
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def encode(self, src, src_mask):
        check_mask(src, src_mask, "src", self.cfg.max_len)
        check_src_mask(src_mask)
        x = self.embed(src, self.src_emb.weight)
        mask = src_mask.unsqueeze(-2)  # [B, 1, S]
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x) if self.cfg.norm == "pre" else x

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        check_mask(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        check_src_mask(src_mask)
        if memory.shape[:2] != src_mask.shape or memory.size(0) != tgt_in.size(0):
            raise ValueError("memory, src_mask and tgt_in do not agree on batch and length")
        if not tgt_mask[:, 0].all():
            raise ValueError("the first target position (bos) must be a real token")
        size = tgt_in.size(1)
        subsequent = torch.tril(torch.ones(1, size, size, dtype=torch.bool, device=tgt_in.device))
        tgt_attn = tgt_mask.unsqueeze(-2) & subsequent  # [B, T, T]
        x = self.embed(tgt_in, self.tgt_table())
        for layer in self.decoder:
            x, _, _ = layer(x, memory, src_mask.unsqueeze(-2), tgt_attn)
        return self.generate(x)

    def init_state(self, src_mask):
        check_src_mask(src_mask)
        return DecodeState(0, src_mask, (None,) * len(self.decoder), None)

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.dim() != 1 or y_prev.size(0) != state.src_mask.size(0):
            raise ValueError("y_prev must be [B] like the state")
        if state.pos >= self.cfg.max_len:
            raise ValueError("past max_len")
        x = self.embed(y_prev[:, None], self.tgt_table(), start=state.pos)
        cross = state.cross_kv or (None,) * len(self.decoder)
        self_kv, cross_kv = [], []
        for layer, past, mem_kv in zip(self.decoder, state.self_kv, cross, strict=True):
            x, kv, ckv = layer(x, memory, state.src_mask.unsqueeze(-2), None, past, mem_kv)
            self_kv.append(kv)
            cross_kv.append(ckv)
        new_state = DecodeState(state.pos + 1, state.src_mask, tuple(self_kv), tuple(cross_kv))
        return self.generate(x)[:, 0], new_state


def label_smoothed_loss(logits, targets, eps, pad_id):
    "Label smoothing: q = (1 - eps) one-hot + eps / V, mean over the non-pad targets."
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1)
    true_dist = torch.full_like(logp, eps / V)
    true_dist.scatter_add_(-1, targets.unsqueeze(-1), torch.full_like(logp[..., :1], 1.0 - eps))
    per_token = -(true_dist * logp).sum(dim=-1)
    real = targets != pad_id
    return per_token[real].sum() / real.sum()


def noam_rate(step, d_model, warmup, factor=1.0):
    step = step + 1  # the paper counts from 1
    return factor * (d_model ** (-0.5) * min(step ** (-0.5), step * warmup ** (-1.5)))


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)


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
    "Teacher forcing: the model reads tgt[:, :-1] and predicts tgt[:, 1:]."
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    optimizer = make_optimizer(model)
    was_training = model.training
    model.train()
    losses = []
    order = []
    for step in range(steps):
        if not order:
            order = torch.randperm(src.size(0), generator=gen).split(batch)
            order = list(order)
        idx = order.pop(0)
        s, t = src[idx], tgt[idx]
        out = model(s, t[:, :-1], s != pad_id, t[:, :-1] != pad_id)
        loss = label_smoothed_loss(out, t[:, 1:], smoothing, pad_id)
        rate = lr if lr is not None else noam_rate(step, model.cfg.d_model, warmup, factor)
        for p in optimizer.param_groups:
            p["lr"] = rate
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if callback:
            callback(step, rate, loss.item())
    model.train(was_training)
    return losses


def beam_search(model, memory, src_mask, bos, eos, max_len, beam_size, length_penalty):
    live = [((), 0.0)]
    finished = []
    state = model.init_state(src_mask)
    for _ in range(max_len):
        prev = torch.tensor([toks[-1] if toks else bos for toks, _ in live])
        logits, next_state = model.decode_step(prev, memory.expand(len(live), -1, -1), state)
        logp = F.log_softmax(logits, dim=-1)
        top, ids = logp.sort(dim=-1, descending=True, stable=True)
        candidates = []
        for i, (_, score) in enumerate(live):
            for r in range(min(beam_size, logp.size(-1))):
                candidates.append((score + top[i, r].item(), i, ids[i, r].item()))
        candidates.sort(key=lambda c: c[0], reverse=True)  # stable, also reversed
        new_live, parents = [], []
        for score, i, tok in candidates:
            toks = live[i][0] + (tok,)
            if tok == eos:
                finished.append((toks, score / len(toks) ** length_penalty))
            else:
                new_live.append((toks, score))
                parents.append(i)
                if len(new_live) == beam_size:
                    break
        live = new_live
        if len(finished) >= beam_size or not live:
            break
        state = next_state.select(torch.tensor(parents))
    if not finished:
        finished = [(toks, score / len(toks) ** length_penalty) for toks, score in live]
    best = max(finished, key=lambda f: f[1])[0]  # max keeps the first of equal scores
    return list(best[:-1]) if best[-1] == eos else list(best)


def translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0):
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len={max_len} is above the model's {model.cfg.max_len}")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        src_mask = src != pad_id
        memory = model.encode(src, src_mask)
        result = [
            beam_search(
                model, memory[i : i + 1], src_mask[i : i + 1], bos, eos, max_len, beam_size,
                length_penalty,
            )
            for i in range(src.size(0))
        ]
    model.train(was_training)
    return result


def save_transformer(model, dir):
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(asdict(model.cfg)))
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(weights, path / "model.safetensors")


def load_transformer(dir):
    path = Path(dir)
    cfg = TransformerConfig(**json.loads((path / "config.json").read_text()))
    weights = load_file(path / "model.safetensors")
    model = Transformer(cfg).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights)
    return model
