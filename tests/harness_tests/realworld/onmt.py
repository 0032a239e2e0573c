"""transformer.py: an encoder-decoder Transformer laid out as OpenNMT-py lays it out.

The modules keep OpenNMT's names (encoder.transformer.{i}.self_attn.linear_query / linear_keys /
linear_values / final_linear, layer_norm, feed_forward.w_1 / w_2 / layer_norm; the decoder's
transformer_layers.{i} with context_attn and layer_norm_1 / layer_norm_2; a generator for the
output layer), so that my OpenNMT checkpoints load with a plain rename. Only state_dict() and
load_state_dict() speak the course's names: a state_dict hook renames each entry (the tensors
themselves are the parameters) and a load pre-hook renames back. named_parameters() keeps the
OpenNMT names.
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
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pe = torch.zeros(length, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.to(dtype)


class MultiHeadedAttention(nn.Module):
    """OpenNMT's attention: linear_keys, linear_values, linear_query, final_linear."""

    def __init__(self, head_count: int, model_dim: int, dropout: float):
        super().__init__()
        self.head_count, self.dim_per_head = head_count, model_dim // head_count
        self.linear_keys = nn.Linear(model_dim, model_dim)
        self.linear_values = nn.Linear(model_dim, model_dim)
        self.linear_query = nn.Linear(model_dim, model_dim)
        self.final_linear = nn.Linear(model_dim, model_dim)
        self.dropout = nn.Dropout(dropout)

    def shape(self, x: Tensor) -> Tensor:
        B = x.size(0)
        return x.view(B, -1, self.head_count, self.dim_per_head).transpose(1, 2)

    def forward(self, key, value, query, mask=None, layer_cache=None, kind="self"):
        """mask [B, 1|T, S]: True = masked out. layer_cache: a dict updated in place with the
        projected keys and values ("self_keys", "memory_keys", ...)."""
        if layer_cache is not None:
            if kind == "self":
                k, v = self.shape(self.linear_keys(key)), self.shape(self.linear_values(value))
                if "self_keys" in layer_cache:
                    k = torch.cat([layer_cache["self_keys"], k], dim=2)
                    v = torch.cat([layer_cache["self_values"], v], dim=2)
                layer_cache["self_keys"], layer_cache["self_values"] = k, v
            else:
                if "memory_keys" not in layer_cache:
                    layer_cache["memory_keys"] = self.shape(self.linear_keys(key))
                    layer_cache["memory_values"] = self.shape(self.linear_values(value))
                k, v = layer_cache["memory_keys"], layer_cache["memory_values"]
        else:
            k, v = self.shape(self.linear_keys(key)), self.shape(self.linear_values(value))
        q = self.shape(self.linear_query(query)) / math.sqrt(self.dim_per_head)
        scores = torch.matmul(q, k.transpose(2, 3))
        if mask is not None:
            scores = scores.masked_fill(mask[:, None], float("-inf"))
        attn = self.dropout(torch.softmax(scores, dim=-1))
        context = torch.matmul(attn, v).transpose(1, 2).contiguous()
        context = context.view(context.size(0), -1, self.head_count * self.dim_per_head)
        return self.final_linear(context), attn


class PositionwiseFeedForward(nn.Module):
    """A container of OpenNMT's names (w_1, w_2, layer_norm); the layer calls them."""

    def __init__(self, d_model: int, d_ff: int, eps: float):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)


class TransformerEncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.self_attn = MultiHeadedAttention(cfg.n_heads, cfg.d_model, cfg.dropout)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def ff(self, x):
        f = self.feed_forward
        return self.dropout(f.w_2(self.dropout(F.relu(f.w_1(x)))))

    def forward(self, x, mask):
        norm2 = self.feed_forward.layer_norm
        if self.pre:
            h = self.layer_norm(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask=mask)[0])
            return x + self.ff(norm2(x))
        x = self.layer_norm(x + self.dropout(self.self_attn(x, x, x, mask=mask)[0]))
        return norm2(x + self.ff(x))


class TransformerDecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.self_attn = MultiHeadedAttention(cfg.n_heads, cfg.d_model, cfg.dropout)
        self.context_attn = MultiHeadedAttention(cfg.n_heads, cfg.d_model, cfg.dropout)
        self.layer_norm_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.layer_norm_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def ff(self, x):
        f = self.feed_forward
        return self.dropout(f.w_2(self.dropout(F.relu(f.w_1(x)))))

    def forward(self, y, memory, src_pad_mask, tgt_mask, layer_cache=None):
        norm3 = self.feed_forward.layer_norm
        if self.pre:
            h = self.layer_norm_1(y)
            a = self.self_attn(h, h, h, mask=tgt_mask, layer_cache=layer_cache, kind="self")[0]
            y = y + self.dropout(a)
            h = self.layer_norm_2(y)
            c = self.context_attn(memory, memory, h, mask=src_pad_mask, layer_cache=layer_cache,
                                  kind="context")[0]
            y = y + self.dropout(c)
            return y + self.ff(norm3(y))
        a = self.self_attn(y, y, y, mask=tgt_mask, layer_cache=layer_cache, kind="self")[0]
        y = self.layer_norm_1(y + self.dropout(a))
        c = self.context_attn(memory, memory, y, mask=src_pad_mask, layer_cache=layer_cache,
                              kind="context")[0]
        y = self.layer_norm_2(y + self.dropout(c))
        return norm3(y + self.ff(y))


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.transformer = nn.ModuleList([TransformerEncoderLayer(cfg) for _ in range(cfg.n_enc)])
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None

    def forward(self, x, mask):
        for layer in self.transformer:
            x = layer(x, mask)
        return x if self.layer_norm is None else self.layer_norm(x)


class TransformerDecoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.transformer_layers = nn.ModuleList(
            [TransformerDecoderLayer(cfg) for _ in range(cfg.n_dec)]
        )
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None

    def forward(self, y, memory, src_pad_mask, tgt_mask, cache=None):
        for i, layer in enumerate(self.transformer_layers):
            y = layer(y, memory, src_pad_mask, tgt_mask, None if cache is None else cache[i])
        return y if self.layer_norm is None else self.layer_norm(y)


# OpenNMT's module names -> the course's checkpoint names (and back)
ONMT_TO_COURSE = [
    (r"^encoder\.transformer\.(\d+)\.", r"encoder.\1."),
    (r"^decoder\.transformer_layers\.(\d+)\.", r"decoder.\1."),
    (r"^encoder\.layer_norm\.", "enc_norm."),
    (r"^decoder\.layer_norm\.", "dec_norm."),
    (r"^generator\.", "out."),
    (r"\.context_attn\.", ".cross_attn."),
    (r"\.linear_query\.", ".q_proj."),
    (r"\.linear_keys\.", ".k_proj."),
    (r"\.linear_values\.", ".v_proj."),
    (r"\.final_linear\.", ".out_proj."),
    (r"^(encoder\.\d+)\.layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.\d+)\.feed_forward\.layer_norm\.", r"\1.norm2."),
    (r"^(decoder\.\d+)\.layer_norm_1\.", r"\1.norm1."),
    (r"^(decoder\.\d+)\.layer_norm_2\.", r"\1.norm2."),
    (r"^(decoder\.\d+)\.feed_forward\.layer_norm\.", r"\1.norm3."),
    (r"\.feed_forward\.w_1\.", ".linear1."),
    (r"\.feed_forward\.w_2\.", ".linear2."),
]
COURSE_TO_ONMT = [
    (r"^encoder\.(\d+)\.norm1\.", r"encoder.\1.layer_norm."),
    (r"^encoder\.(\d+)\.norm2\.", r"encoder.\1.feed_forward.layer_norm."),
    (r"^decoder\.(\d+)\.norm1\.", r"decoder.\1.layer_norm_1."),
    (r"^decoder\.(\d+)\.norm2\.", r"decoder.\1.layer_norm_2."),
    (r"^decoder\.(\d+)\.norm3\.", r"decoder.\1.feed_forward.layer_norm."),
    (r"\.linear1\.", ".feed_forward.w_1."),
    (r"\.linear2\.", ".feed_forward.w_2."),
    (r"\.q_proj\.", ".linear_query."),
    (r"\.k_proj\.", ".linear_keys."),
    (r"\.v_proj\.", ".linear_values."),
    (r"\.out_proj\.", ".final_linear."),
    (r"\.cross_attn\.", ".context_attn."),
    (r"^encoder\.(\d+)\.", r"encoder.transformer.\1."),
    (r"^decoder\.(\d+)\.", r"decoder.transformer_layers.\1."),
    (r"^enc_norm\.", "encoder.layer_norm."),
    (r"^dec_norm\.", "decoder.layer_norm."),
    (r"^out\.", "generator."),
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
            k = prefix + rename(k[len(prefix) :], ONMT_TO_COURSE)
        state_dict[k] = v
    return state_dict


def _onmt_names(state_dict, prefix, *args):
    for k in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + rename(k[len(prefix) :], COURSE_TO_ONMT)] = state_dict.pop(k)


@dataclass(frozen=True)
class DecodeState:
    step: int
    src_mask: Tensor
    cache: tuple = field(default=())  # one dict per decoder layer


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
        self.generator = None if cfg.tie_embeddings else nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.encoder = TransformerEncoder(cfg)
        self.decoder = TransformerDecoder(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        for m in (self.src_emb, self.tgt_emb, self.generator):
            if m is not None:
                nn.init.normal_(m.weight, std=d**-0.5)
        self._register_state_dict_hook(_course_names)
        self._register_load_state_dict_pre_hook(_onmt_names)

    def _table(self):
        return self.src_emb.weight if self.tgt_emb is None else self.tgt_emb.weight

    def _embed(self, ids, table, step=0):
        d = self.cfg.d_model
        x = F.embedding(ids, table) * math.sqrt(d)
        pe = sinusoid_table(step + ids.shape[1], d, x.dtype)[step:]
        return self.drop(x + pe.to(x.device))

    def _logits(self, y):
        if self.generator is not None:
            return self.generator(y)
        return F.linear(y, self._table())

    def encode(self, src, src_mask):
        _check(src, src_mask, "src", self.cfg.max_len)
        _check_src(src_mask)
        return self.encoder(self._embed(src, self.src_emb.weight), ~src_mask[:, None, :])

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        _check(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        _check_src(src_mask)
        B, T = tgt_in.shape
        if memory.shape[0] != B or memory.shape[:2] != src_mask.shape:
            raise ValueError(f"memory {tuple(memory.shape)} does not fit src_mask / tgt_in")
        if not bool(tgt_mask[:, 0].all()):
            raise ValueError("target rows must start with bos, not padding")
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), 1)
        dec_mask = future[None] | ~tgt_mask[:, None, :]
        y = self.decoder(self._embed(tgt_in, self._table()), memory, ~src_mask[:, None], dec_mask)
        return self._logits(y)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"batch sizes differ: {src.shape[0]} vs {tgt_in.shape[0]}")
        memory = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask, tgt_mask)

    def init_state(self, src_mask):
        _check_src(src_mask)
        return DecodeState(0, src_mask, tuple({} for _ in range(self.cfg.n_dec)))

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.shape != (B,):
            raise ValueError(f"y_prev must have shape [B], got {tuple(y_prev.shape)}")
        if state.step >= self.cfg.max_len:
            raise ValueError("decoding past max_len")
        cache = tuple(dict(c) for c in state.cache)  # never mutate the given state
        y = self._embed(y_prev[:, None], self._table(), step=state.step)
        y = self.decoder(y, memory, ~state.src_mask[:, None], None, cache)
        return self._logits(y)[:, 0], DecodeState(state.step + 1, state.src_mask, cache)


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
