"""transformer.py in a functional style.

The modules only hold parameters (their forward is never called): every computation is a plain
function of those parameters, written with torch.nn.functional (F.linear, F.layer_norm,
F.scaled_dot_product_attention, F.dropout with an explicit `training` flag). The parameter
tree follows the course's names, so state_dict() needs no translation.
"""

import json
import math
from dataclasses import asdict, dataclass, replace
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


# --- parameter containers ---------------------------------------------------------------------


class Linear(nn.Module):
    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * n_in**-0.5)
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None


class Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (Linear(d, d) for _ in range(4))


class EncoderBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg.d_model)
        self.linear1 = Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = Linear(cfg.d_ff, cfg.d_model)
        self.norm1, self.norm2 = Norm(cfg.d_model), Norm(cfg.d_model)


class DecoderBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg.d_model)
        self.cross_attn = Attention(cfg.d_model)
        self.linear1 = Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = Linear(cfg.d_ff, cfg.d_model)
        self.norm1, self.norm2, self.norm3 = Norm(cfg.d_model), Norm(cfg.d_model), Norm(cfg.d_model)


# --- the computation --------------------------------------------------------------------------


def linear(p, x):
    return F.linear(x, p.weight, p.bias)


def layer_norm(p, x, eps):
    return F.layer_norm(x, p.weight.shape, p.weight, p.bias, eps)


def heads(x, h):
    B, L, d = x.shape
    return x.view(B, L, h, d // h).transpose(1, 2)  # [B, h, L, d_k]


def keys_values(p, x, h):
    return heads(linear(p.k_proj, x), h), heads(linear(p.v_proj, x), h)


def attend(p, x, kv, mask, h, p_drop):
    """x [B, T, d] reads the heads kv ([B, h, S, d_k] each); mask [B, 1, T|1, S], True = read."""
    q = heads(linear(p.q_proj, x), h)
    out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, dropout_p=p_drop)
    B, _, T, _ = out.shape
    return linear(p.out_proj, out.transpose(1, 2).reshape(B, T, -1))


def residual(x, f, p_norm, cfg, training):
    if cfg.norm == "pre":
        return x + F.dropout(f(layer_norm(p_norm, x, cfg.ln_eps)), cfg.dropout, training)
    return layer_norm(p_norm, x + F.dropout(f(x), cfg.dropout, training), cfg.ln_eps)


def ffn(p, x, cfg, training):
    return linear(p.linear2, F.dropout(F.relu(linear(p.linear1, x)), cfg.dropout, training))


def encoder_block(p, x, mask, cfg, training):
    h, rate = cfg.n_heads, cfg.dropout if training else 0.0
    x = residual(
        x, lambda z: attend(p.self_attn, z, keys_values(p.self_attn, z, h), mask, h, rate),
        p.norm1, cfg, training,
    )
    return residual(x, lambda z: ffn(p, z, cfg, training), p.norm2, cfg, training)


def decoder_block(p, y, memory_kv, self_mask, cross_mask, past, cfg, training):
    """Returns y and the self-attention keys/values of every position so far (past + y's)."""
    h, rate = cfg.n_heads, cfg.dropout if training else 0.0
    seen = []

    def self_attention(z):
        k, v = keys_values(p.self_attn, z, h)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        seen.append((k, v))
        return attend(p.self_attn, z, (k, v), self_mask, h, rate)

    y = residual(y, self_attention, p.norm1, cfg, training)
    y = residual(
        y, lambda z: attend(p.cross_attn, z, memory_kv, cross_mask, h, rate), p.norm2, cfg, training
    )
    y = residual(y, lambda z: ffn(p, z, cfg, training), p.norm3, cfg, training)
    return y, seen[0]


def sinusoids(start, n, d, dtype, device):
    pos = torch.arange(start, start + n, dtype=torch.float64, device=device)[:, None]
    i = torch.arange(d, device=device)
    inv = torch.pow(10000.0, -(i - i % 2).to(torch.float64) / d)
    angle = pos * inv
    return torch.where(i % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


def validate(ids, mask, name, max_len):
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        raise TypeError(f"{name}: the mask must be a bool tensor")
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"{name}: mask {tuple(mask.shape)} vs ids {tuple(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name}: length {ids.shape[1]} > max_len {max_len}")


def validate_source_mask(src_mask):
    if not (isinstance(src_mask, torch.Tensor) and src_mask.dtype == torch.bool):
        raise TypeError("src_mask must be a bool tensor")
    if bool((src_mask.sum(-1) == 0).any()):
        raise ValueError("a source row has no real token")


@dataclass(frozen=True)
class DecodeState:
    pos: int
    src_mask: torch.Tensor
    self_kv: tuple = ()
    memory_kv: tuple = ()

    def take(self, rows):
        grab = lambda pairs: tuple((k[rows], v[rows]) for k, v in pairs)  # noqa: E731
        return replace(
            self, src_mask=self.src_mask[rows], self_kv=grab(self.self_kv),
            memory_kv=grab(self.memory_kv),
        )


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        if cfg.norm not in ("post", "pre"):
            raise ValueError(f"norm must be post or pre, got {cfg.norm}")
        self.cfg = cfg
        d = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        nn.init.normal_(self.src_emb.weight, std=d**-0.5)
        if not (cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab):
            self.tgt_emb = nn.Embedding(cfg.tgt_vocab, d)
            nn.init.normal_(self.tgt_emb.weight, std=d**-0.5)
        if not cfg.tie_embeddings:
            self.out = Linear(d, cfg.tgt_vocab, bias=False)
        self.encoder = nn.ModuleList([EncoderBlock(cfg) for _ in range(cfg.n_enc)])
        self.decoder = nn.ModuleList([DecoderBlock(cfg) for _ in range(cfg.n_dec)])
        if cfg.norm == "pre":
            self.enc_norm, self.dec_norm = Norm(d), Norm(d)

    def _tgt_weight(self):
        return self.tgt_emb.weight if hasattr(self, "tgt_emb") else self.src_emb.weight

    def _x0(self, ids, table, start=0):
        x = F.embedding(ids, table) * math.sqrt(self.cfg.d_model)
        x = x + sinusoids(start, ids.shape[1], self.cfg.d_model, x.dtype, x.device)
        return F.dropout(x, self.cfg.dropout, self.training)

    def _logits(self, y):
        if self.cfg.norm == "pre":
            y = layer_norm(self.dec_norm, y, self.cfg.ln_eps)
        return F.linear(y, self.out.weight if hasattr(self, "out") else self._tgt_weight())

    def encode(self, src, src_mask):
        validate(src, src_mask, "src", self.cfg.max_len)
        validate_source_mask(src_mask)
        x = self._x0(src, self.src_emb.weight)
        for p in self.encoder:
            x = encoder_block(p, x, src_mask[:, None, None, :], self.cfg, self.training)
        if self.cfg.norm == "pre":
            x = layer_norm(self.enc_norm, x, self.cfg.ln_eps)
        return x

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        validate(tgt_in, tgt_mask, "tgt_in", self.cfg.max_len)
        validate_source_mask(src_mask)
        if memory.shape[0] != tgt_in.shape[0] or memory.shape[:2] != src_mask.shape:
            raise ValueError("memory does not fit tgt_in and src_mask")
        if not bool(tgt_mask[:, 0].all()):
            raise ValueError("target position 0 (bos) is padding")
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()
        self_mask = causal & tgt_mask[:, None, None, :]
        cross_mask = src_mask[:, None, None, :]
        y = self._x0(tgt_in, self._tgt_weight())
        h = self.cfg.n_heads
        for p in self.decoder:
            memory_kv = keys_values(p.cross_attn, memory, h)
            y, _ = decoder_block(p, y, memory_kv, self_mask, cross_mask, None, self.cfg,
                                 self.training)
        return self._logits(y)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError("src and tgt_in batch sizes differ")
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def init_state(self, src_mask):
        validate_source_mask(src_mask)
        return DecodeState(0, src_mask)

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.shape != (state.src_mask.shape[0],):
            raise ValueError("y_prev must be [B]")
        if state.pos >= self.cfg.max_len:
            raise ValueError("max_len reached")
        memory_kv = state.memory_kv or tuple(
            keys_values(p.cross_attn, memory, self.cfg.n_heads) for p in self.decoder
        )
        past = state.self_kv or (None,) * len(self.decoder)
        y = self._x0(y_prev[:, None], self._tgt_weight(), state.pos)
        cross_mask = state.src_mask[:, None, None, :]
        self_kv = []
        for p, mkv, pkv in zip(self.decoder, memory_kv, past, strict=True):
            y, kv = decoder_block(p, y, mkv, None, cross_mask, pkv, self.cfg, self.training)
            self_kv.append(kv)
        logits = self._logits(y)[:, 0]
        return logits, DecodeState(state.pos + 1, state.src_mask, tuple(self_kv), memory_kv)


def label_smoothed_loss(logits, targets, eps, pad_id):
    V = logits.shape[-1]
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    t = targets.reshape(-1)
    real = t != pad_id
    nll = F.nll_loss(logp, t, ignore_index=pad_id, reduction="sum")
    uniform = -(logp.sum(-1) * real).sum() / V
    return ((1 - eps) * nll + eps * uniform) / real.sum()


def noam_rate(step, d_model, warmup, factor=1.0):
    s = step + 1
    return factor * min(s**-0.5, s * warmup**-1.5) / math.sqrt(d_model)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)


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
    rng = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer(model)
    mode = model.training
    model.train()
    torch.manual_seed(seed)
    history = []
    batches = iter(())
    for step in range(steps):
        rows = next(batches, None)
        if rows is None:
            batches = iter(torch.randperm(src.shape[0], generator=rng).split(batch))
            rows = next(batches)
        x, y = src[rows], tgt[rows]
        loss = label_smoothed_loss(
            model(x, y[:, :-1], x != pad_id, y[:, :-1] != pad_id), y[:, 1:], smoothing, pad_id
        )
        rate = noam_rate(step, model.cfg.d_model, warmup, factor) if lr is None else lr
        for group in optimizer.param_groups:
            group["lr"] = rate
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
        if callback is not None:
            callback(step, rate, history[-1])
    model.train(mode)
    return history


def search(model, memory, src_mask, bos, eos, max_len, k, alpha):
    beams = [((), 0.0)]
    state = model.init_state(src_mask)
    done = []
    for _ in range(max_len):
        y_prev = torch.tensor([b[0][-1] if b[0] else bos for b in beams])
        logits, state = model.decode_step(y_prev, memory.expand(len(beams), -1, -1), state)
        logp = logits.log_softmax(-1)
        ranked = torch.sort(logp, dim=-1, descending=True, stable=True)
        options = []
        for b, (tokens, total) in enumerate(beams):
            for r in range(min(k, logp.shape[-1])):
                tok = int(ranked.indices[b, r])
                options.append((total + float(ranked.values[b, r]), b, tokens + (tok,)))
        options.sort(key=lambda o: o[0], reverse=True)
        beams, rows = [], []
        for total, b, tokens in options:
            if tokens[-1] == eos:
                done.append((total / len(tokens) ** alpha, tokens))
                continue
            beams.append((tokens, total))
            rows.append(b)
            if len(beams) == k:
                break
        if len(done) >= k or not beams:
            break
        state = state.take(torch.tensor(rows))
    if not done:
        done = [(total / len(tokens) ** alpha, tokens) for tokens, total in beams]
    winner = done[0]
    for candidate in done[1:]:
        if candidate[0] > winner[0]:
            winner = candidate
    tokens = list(winner[1])
    return tokens[:-1] if tokens[-1] == eos else tokens


def translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0):
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len={max_len} is above the model's {model.cfg.max_len}")
    mode = model.training
    model.eval()
    try:
        with torch.no_grad():
            mask = src != pad_id
            memory = model.encode(src, mask)
            return [
                search(model, memory[b : b + 1], mask[b : b + 1], bos, eos, max_len, beam_size,
                       length_penalty)
                for b in range(src.shape[0])
            ]
    finally:
        model.train(mode)


def save_transformer(model, dir):
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(asdict(model.cfg)))
    tensors = {k: t.contiguous() for k, t in model.state_dict().items()}
    save_file(tensors, folder / "model.safetensors")


def load_transformer(dir):
    folder = Path(dir)
    cfg = TransformerConfig(**json.loads((folder / "config.json").read_text()))
    state = load_file(folder / "model.safetensors")
    model = Transformer(cfg).to(next(iter(state.values())).dtype)
    model.load_state_dict(state)
    return model
