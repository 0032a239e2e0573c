"""transformer.py: an encoder-decoder Transformer written the way fairseq writes one.

Inside the stacks every tensor is time-first (T x B x C), as in fairseq: the embeddings are
transposed once on the way in and the output once on the way out, so the contract's entry points
stay batch-first. The modules keep fairseq's names (encoder.layers.{i}.self_attn.q_proj ...,
self_attn_layer_norm, fc1, fc2, final_layer_norm, the decoder's encoder_attn and
encoder_attn_layer_norm, encoder.layer_norm / decoder.layer_norm for pre-LN, embed_tokens,
output_projection) and step-by-step decoding keeps an incremental state: a dict of each
attention's saved keys and values, keyed by the attention module. state_dict() and
load_state_dict() speak the course's names through a pair of hooks.
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


def sinusoidal_positions(length: int, d: int, dtype: torch.dtype) -> Tensor:
    """[length, d], interleaved sin/cos (the course's table, not fairseq's halves)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.empty(length, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
    return table.to(dtype)


class MultiheadAttention(nn.Module):
    """fairseq's attention: query [T, B, C], key/value [S, B, C]; returns ([T, B, C], weights)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout_module = nn.Dropout(dropout)

    def _heads(self, x: Tensor) -> Tensor:  # [L, B, C] -> [B * h, L, d_h]
        L, B, _ = x.shape
        return x.contiguous().view(L, B * self.num_heads, self.head_dim).transpose(0, 1)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None,
                incremental_state=None, static_kv=False):
        T, B, C = query.shape
        q = self._heads(self.q_proj(query) * self.scaling)
        saved = None if incremental_state is None else incremental_state.get(id(self))
        if saved is not None and static_kv:
            k, v = saved["prev_key"], saved["prev_value"]
        else:
            k, v = self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
            if saved is not None:
                k = torch.cat([saved["prev_key"], k], dim=1)
                v = torch.cat([saved["prev_value"], v], dim=1)
        if incremental_state is not None:
            incremental_state[id(self)] = {"prev_key": k, "prev_value": v}
        scores = torch.bmm(q, k.transpose(1, 2))  # [B * h, T, S]
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask[None], float("-inf"))
        if key_padding_mask is not None:
            scores = scores.view(B, self.num_heads, T, -1)
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            scores = scores.view(B * self.num_heads, T, -1)
        probs = self.dropout_module(F.softmax(scores, dim=-1))
        attn = torch.bmm(probs, v).transpose(0, 1).contiguous().view(T, B, C)
        return self.out_proj(attn), probs


class TransformerEncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.normalize_before = cfg.norm == "pre"
        self.self_attn = MultiheadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout_module = nn.Dropout(cfg.dropout)
        self.activation_dropout_module = nn.Dropout(cfg.dropout)

    def forward(self, x, encoder_padding_mask):
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(x, x, x, key_padding_mask=encoder_padding_mask)
        x = residual + self.dropout_module(x)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.fc2(self.activation_dropout_module(F.relu(self.fc1(x))))
        x = residual + self.dropout_module(x)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x


class TransformerDecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.normalize_before = cfg.norm == "pre"
        self.self_attn = MultiheadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.encoder_attn = MultiheadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout_module = nn.Dropout(cfg.dropout)
        self.activation_dropout_module = nn.Dropout(cfg.dropout)

    def forward(self, x, encoder_out, encoder_padding_mask, self_attn_mask=None,
                self_attn_padding_mask=None, incremental_state=None):
        pre = self.normalize_before
        residual = x
        x = self.self_attn_layer_norm(x) if pre else x
        x, _ = self.self_attn(x, x, x, key_padding_mask=self_attn_padding_mask,
                              attn_mask=self_attn_mask, incremental_state=incremental_state)
        x = residual + self.dropout_module(x)
        x = x if pre else self.self_attn_layer_norm(x)
        residual = x
        x = self.encoder_attn_layer_norm(x) if pre else x
        x, _ = self.encoder_attn(x, encoder_out, encoder_out,
                                 key_padding_mask=encoder_padding_mask,
                                 incremental_state=incremental_state, static_kv=True)
        x = residual + self.dropout_module(x)
        x = x if pre else self.encoder_attn_layer_norm(x)
        residual = x
        x = self.final_layer_norm(x) if pre else x
        x = self.fc2(self.activation_dropout_module(F.relu(self.fc1(x))))
        x = residual + self.dropout_module(x)
        return x if pre else self.final_layer_norm(x)


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(cfg.d_model)
        self.dropout_module = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList([TransformerEncoderLayer(cfg) for _ in range(cfg.n_enc)])
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None

    def forward(self, src_tokens, encoder_padding_mask):
        x = self.embed_scale * self.embed_tokens(src_tokens)
        x = x + sinusoidal_positions(src_tokens.shape[1], x.shape[-1], x.dtype)
        x = self.dropout_module(x).transpose(0, 1)  # B x T x C -> T x B x C
        for layer in self.layers:
            x = layer(x, encoder_padding_mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x  # T x B x C


class TransformerDecoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, embed_tokens: nn.Embedding, output_weight):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(cfg.d_model)
        self.dropout_module = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList([TransformerDecoderLayer(cfg) for _ in range(cfg.n_dec)])
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm == "pre" else None
        if output_weight is None:
            self.output_projection = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
            nn.init.normal_(self.output_projection.weight, std=cfg.d_model**-0.5)
        else:
            self.output_projection = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
            self.output_projection.weight = output_weight  # shared with the embeddings

    def forward(self, prev_output_tokens, encoder_out, encoder_padding_mask,
                self_padding_mask=None, incremental_state=None, start=0):
        T = prev_output_tokens.shape[1]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        x = x + sinusoidal_positions(start + T, x.shape[-1], x.dtype)[start:]
        x = self.dropout_module(x).transpose(0, 1)
        future = None
        if incremental_state is None:
            future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        for layer in self.layers:
            x = layer(x, encoder_out, encoder_padding_mask, future, self_padding_mask,
                      incremental_state)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.output_projection(x.transpose(0, 1))  # B x T x V


# fairseq's names -> the course's checkpoint names (and back)
TO_COURSE = [
    (r"^encoder\.embed_tokens\.", "src_emb."),
    (r"^decoder\.embed_tokens\.", "tgt_emb."),
    (r"^decoder\.output_projection\.", "out."),
    (r"^encoder\.layer_norm\.", "enc_norm."),
    (r"^decoder\.layer_norm\.", "dec_norm."),
    (r"^(encoder|decoder)\.layers\.(\d+)\.", r"\1.\2."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"^(encoder\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(encoder\.\d+)\.final_layer_norm\.", r"\1.norm2."),
    (r"^(decoder\.\d+)\.self_attn_layer_norm\.", r"\1.norm1."),
    (r"^(decoder\.\d+)\.encoder_attn_layer_norm\.", r"\1.norm2."),
    (r"^(decoder\.\d+)\.final_layer_norm\.", r"\1.norm3."),
    (r"\.fc1\.", ".linear1."),
    (r"\.fc2\.", ".linear2."),
]
TO_FAIRSEQ = [
    (r"^src_emb\.", "encoder.embed_tokens."),
    (r"^tgt_emb\.", "decoder.embed_tokens."),
    (r"^out\.", "decoder.output_projection."),
    (r"^enc_norm\.", "encoder.layer_norm."),
    (r"^dec_norm\.", "decoder.layer_norm."),
    (r"^(encoder|decoder)\.(\d+)\.norm1\.", r"\1.\2.self_attn_layer_norm."),
    (r"^encoder\.(\d+)\.norm2\.", r"encoder.\1.final_layer_norm."),
    (r"^decoder\.(\d+)\.norm2\.", r"decoder.\1.encoder_attn_layer_norm."),
    (r"^decoder\.(\d+)\.norm3\.", r"decoder.\1.final_layer_norm."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.linear1\.", ".fc1."),
    (r"\.linear2\.", ".fc2."),
    (r"^(encoder|decoder)\.(\d+)\.", r"\1.layers.\2."),
]


def rename(key: str, rules) -> str:
    for pattern, repl in rules:
        key = re.sub(pattern, repl, key)
    return key


def _course_names(module, state_dict, prefix, local_metadata):
    items = list(state_dict.items())
    state_dict.clear()
    seen = set()
    for k, v in items:
        if k.startswith(prefix):
            k = prefix + rename(k[len(prefix) :], TO_COURSE)
        if k.startswith(prefix) and module.tied(k[len(prefix) :]):
            continue  # a shared table is listed once
        if id(v) not in seen or not k.startswith(prefix):
            state_dict[k] = v
    return state_dict


def _fairseq_names(module, state_dict, prefix, *args):
    for k in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + rename(k[len(prefix) :], TO_FAIRSEQ)] = state_dict.pop(k)
    for name in module.tied_names():  # the shared tables load through their one entry
        source = prefix + rename(module.tied_source(name), TO_FAIRSEQ)
        if source in state_dict:
            state_dict[prefix + rename(name, TO_FAIRSEQ)] = state_dict[source]


@dataclass(frozen=True)
class DecodeState:
    step: int
    src_mask: Tensor
    incremental_state: dict = field(default_factory=dict)


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
        src_tokens = nn.Embedding(cfg.src_vocab, d)
        share_all = cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
        tgt_tokens = src_tokens if share_all else nn.Embedding(cfg.tgt_vocab, d)
        for table in (src_tokens, tgt_tokens):
            nn.init.normal_(table.weight, std=d**-0.5)
        self.encoder = TransformerEncoder(cfg, src_tokens)
        shared = tgt_tokens.weight if cfg.tie_embeddings else None
        self.decoder = TransformerDecoder(cfg, tgt_tokens, shared)
        self._register_state_dict_hook(_course_names)
        self._register_load_state_dict_pre_hook(_fairseq_names, with_module=True)

    # which course names are another table's (listed once)
    def tied_names(self):
        names = []
        if self.cfg.tie_embeddings:
            names.append("out.weight")
            if self.cfg.src_vocab == self.cfg.tgt_vocab:
                names.append("tgt_emb.weight")
        return names

    def tied(self, name):
        return name in self.tied_names()

    def tied_source(self, name):
        if name == "tgt_emb.weight" or self.cfg.src_vocab == self.cfg.tgt_vocab:
            return "src_emb.weight"
        return "tgt_emb.weight"

    def encode(self, src, src_mask):
        _check(src, src_mask, "src", self.cfg.max_len)
        _check_src(src_mask)
        return self.encoder(src, ~src_mask).transpose(0, 1)  # the contract's [B, S, d]

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        _check(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        _check_src(src_mask)
        B, T = tgt_in.shape
        if memory.shape[0] != B or memory.shape[:2] != src_mask.shape:
            raise ValueError(f"memory {tuple(memory.shape)} does not fit src_mask / tgt_in")
        if not bool(tgt_mask[:, 0].all()):
            raise ValueError("target rows must start with bos, not padding")
        return self.decoder(tgt_in, memory.transpose(0, 1), ~src_mask, ~tgt_mask)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"batch sizes differ: {src.shape[0]} vs {tgt_in.shape[0]}")
        memory = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask, tgt_mask)

    def init_state(self, src_mask):
        _check_src(src_mask)
        return DecodeState(0, src_mask, {})

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.shape != (B,):
            raise ValueError(f"y_prev must have shape [B], got {tuple(y_prev.shape)}")
        if state.step >= self.cfg.max_len:
            raise ValueError("decoding past max_len")
        incremental = dict(state.incremental_state)  # never mutate the given state
        logits = self.decoder(y_prev[:, None], memory.transpose(0, 1), ~state.src_mask,
                              incremental_state=incremental, start=state.step)
        return logits[:, 0], DecodeState(state.step + 1, state.src_mask, incremental)


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
