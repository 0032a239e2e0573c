"""transformer.py: the course's Transformer on torch's own nn.TransformerEncoder/Decoder stacks.

Started from PyTorch's "Language Translation with nn.Transformer" tutorial: a PositionalEncoding
module with a registered table, batch_first torch layers (norm_first for pre-LN, no final norm in
post-LN), and the checkpoint names translated to the course's (encoder.{i}.self_attn.q_proj...)
by a state_dict hook and a load_state_dict pre-hook. For step-by-step decoding the state keeps,
per decoder layer, the inputs its self-attention has seen so far (the source of its keys and
values), and the step runs each layer's submodules on the new position only.

examples/float32_pe_submission.py: one fault, marked FAULT below: the
positional table is computed in float32 as in the tutorial, though the model
runs in float64.
"""

import json
import math
from dataclasses import asdict, dataclass
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

    def __post_init__(self):
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm={self.norm!r}: use 'post' or 'pre'")


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int):
        super().__init__()
        den = torch.exp(
            -torch.arange(0, emb_size, 2) * math.log(10000) / emb_size
        )
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))  # FAULT: a float32 table
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)[:, : emb_size // 2]
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding, persistent=False)

    def forward(self, token_embedding: Tensor, start: int = 0):
        pe = self.pos_embedding[start : start + token_embedding.size(1)]
        return self.dropout(token_embedding + pe.to(token_embedding.dtype))


# --- checkpoint names: torch's module names <-> the course's --------------------------------------


def to_course(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("encoder", "decoder") and parts[1] == "norm":
        return parts[0][:3] + "_norm." + ".".join(parts[2:])
    if parts[0] in ("encoder", "decoder") and parts[1] == "layers":
        parts = [parts[0]] + parts[2:]
        return ".".join("cross_attn" if p == "multihead_attn" else p for p in parts)
    return name


def save_hook(module, state_dict, prefix, local_metadata):
    d = module.cfg.d_model
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        if not key.startswith(prefix):
            state_dict[key] = value
            continue
        name = to_course(key[len(prefix) :])
        if ".in_proj_" in name:  # q, k and v stacked: one entry each
            head, kind = name.rsplit(".in_proj_", 1)
            for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                state_dict[f"{prefix}{head}.{proj}.{kind}"] = value[i * d : (i + 1) * d]
        else:
            state_dict[prefix + name] = value


def load_hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    course = {to_course(n): n for n, _ in module.named_parameters()}
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = key[len(prefix) :]
        if name in course:
            state_dict[prefix + course[name]] = state_dict.pop(key)
    for name in [n for n, _ in module.named_parameters() if ".in_proj_" in n]:
        head, kind = to_course(name).rsplit(".in_proj_", 1)
        keys = [f"{prefix}{head}.{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
        if all(k in state_dict for k in keys):
            state_dict[prefix + name] = torch.cat([state_dict.pop(k) for k in keys])


@dataclass(frozen=True)
class DecodeState:
    pos: int
    src_mask: Tensor
    seen: tuple  # per decoder layer: its self-attention keys and values so far, or None

    def select(self, rows):
        seen = tuple(None if s is None else (s[0][rows], s[1][rows]) for s in self.seen)
        return DecodeState(self.pos, self.src_mask[rows], seen)


def check(ids, mask, name, max_len):
    if not torch.is_tensor(mask) or mask.dtype != torch.bool:
        raise TypeError(f"{name}_mask must be a torch.bool tensor")
    if mask.shape != ids.shape:
        raise ValueError(f"{name}_mask has shape {tuple(mask.shape)}, {name} {tuple(ids.shape)}")
    if ids.size(1) > max_len:
        raise ValueError(f"{name} is longer than max_len ({ids.size(1)} > {max_len})")


def check_src_mask(src_mask):
    if not torch.is_tensor(src_mask) or src_mask.dtype != torch.bool:
        raise TypeError("src_mask must be a torch.bool tensor")
    if not src_mask.any(dim=1).all():
        raise ValueError("a source row is all padding")


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        self.cfg = cfg
        d, pre = cfg.d_model, cfg.norm == "pre"
        layer_kwargs = dict(
            d_model=d,
            nhead=cfg.n_heads,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout,
            layer_norm_eps=cfg.ln_eps,
            batch_first=True,
            norm_first=pre,
        )
        enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None
        dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_kwargs), cfg.n_enc, norm=enc_norm,
            enable_nested_tensor=False,
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_kwargs), cfg.n_dec, norm=dec_norm
        )
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        self.one_table = cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab
        if not self.one_table:
            self.tgt_emb = nn.Embedding(cfg.tgt_vocab, d)
        if not cfg.tie_embeddings:
            self.out = nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.positional_encoding = PositionalEncoding(d, cfg.dropout, cfg.max_len)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for name, p in self.named_parameters():
            if name in ("src_emb.weight", "tgt_emb.weight", "out.weight"):
                nn.init.normal_(p, 0.0, d**-0.5)
        self.register_state_dict_post_hook(save_hook)
        self.register_load_state_dict_pre_hook(load_hook)

    def tgt_table(self):
        return self.src_emb.weight if self.one_table else self.tgt_emb.weight

    def embed(self, ids, table, start=0):
        emb = nn.functional.embedding(ids, table) * math.sqrt(self.cfg.d_model)
        return self.positional_encoding(emb, start)

    def project(self, y):
        if self.cfg.tie_embeddings:
            return y @ self.tgt_table().t()
        return self.out(y)

    def encode(self, src, src_mask):
        check(src, src_mask, "src", self.cfg.max_len)
        check_src_mask(src_mask)
        return self.encoder(self.embed(src, self.src_emb.weight), src_key_padding_mask=~src_mask)

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        check(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        check_src_mask(src_mask)
        if memory.shape[:2] != src_mask.shape or memory.size(0) != tgt_in.size(0):
            raise ValueError("memory does not match src_mask and tgt_in")
        if not tgt_mask[:, 0].all():
            raise ValueError("position 0 of every target row must be bos, not padding")
        T = tgt_in.size(1)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), diagonal=1)
        y = self.decoder(
            self.embed(tgt_in, self.tgt_table()),
            memory,
            tgt_mask=future,
            tgt_key_padding_mask=~tgt_mask,
            memory_key_padding_mask=~src_mask,
        )
        return self.project(y)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        if src.size(0) != tgt_in.size(0):
            raise ValueError("src and tgt_in batch sizes differ")
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def init_state(self, src_mask):
        check_src_mask(src_mask)
        return DecodeState(0, src_mask, (None,) * len(self.decoder.layers))

    def decode_step(self, y_prev, memory, state):
        B, S = state.src_mask.shape
        if memory.dim() != 3 or tuple(memory.shape) != (B, S, self.cfg.d_model):
            raise ValueError(f"memory must be [B, S, d] = {(B, S, self.cfg.d_model)}")
        if y_prev.shape != state.src_mask.shape[:1]:
            raise ValueError("y_prev must be [B]")
        if state.pos >= self.cfg.max_len:
            raise ValueError("no position left before max_len")
        x = self.embed(y_prev[:, None], self.tgt_table(), start=state.pos)
        seen = []
        for layer, past in zip(self.decoder.layers, state.seen, strict=True):
            x, inputs = layer_step(layer, x, past, memory, ~state.src_mask)
            seen.append(inputs)
        if self.decoder.norm is not None:
            x = self.decoder.norm(x)
        return self.project(x)[:, 0], DecodeState(state.pos + 1, state.src_mask, tuple(seen))


def cached_self_attention(attn, h, past):
    """nn.MultiheadAttention's computation for the newest position h [B, 1, d], reading the
    earlier positions' keys and values from `past` ([B, heads, t, d_k] each) instead of
    projecting the prefix again. Returns the output and the extended (K, V)."""
    B, _, d = h.shape
    heads = attn.num_heads
    q, k, v = F.linear(h, attn.in_proj_weight, attn.in_proj_bias).split(d, dim=-1)
    q, k, v = (t.view(B, 1, heads, d // heads).transpose(1, 2) for t in (q, k, v))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    out = F.scaled_dot_product_attention(q, k, v)  # every cached position is <= the newest
    return attn.out_proj(out.transpose(1, 2).reshape(B, 1, d)), (k, v)


def layer_step(layer, x, past, memory, memory_padding):
    """One nn.TransformerDecoderLayer on the newest position x [B, 1, d]; `past` holds its
    self-attention's keys and values at the earlier positions (a KV cache). Returns x and the
    extended cache."""
    h = layer.norm1(x) if layer.norm_first else x
    a, inputs = cached_self_attention(layer.self_attn, h, past)
    a = layer.dropout1(a)
    if layer.norm_first:
        x = x + a
        q = layer.norm2(x)
    else:
        x = layer.norm1(x + a)
        q = x
    c = layer.multihead_attn(q, memory, memory, key_padding_mask=memory_padding, need_weights=False)
    c = layer.dropout2(c[0])
    if layer.norm_first:
        x = x + c
        x = x + layer._ff_block(layer.norm3(x))
    else:
        x = layer.norm2(x + c)
        x = layer.norm3(x + layer._ff_block(x))
    return x, inputs


def label_smoothed_loss(logits, targets, eps, pad_id):
    V = logits.size(-1)
    return nn.functional.cross_entropy(
        logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=eps
    )


def noam_rate(step, d_model, warmup, factor=1.0):
    step += 1
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


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
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(src, tgt),
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = make_optimizer(model)
    training = model.training
    model.train()
    losses = []
    while len(losses) < steps:
        for s, t in loader:
            step = len(losses)
            if step == steps:
                break
            rate = lr if lr is not None else noam_rate(step, model.cfg.d_model, warmup, factor)
            for g in optimizer.param_groups:
                g["lr"] = rate
            tgt_input, tgt_out = t[:, :-1], t[:, 1:]
            logits = model(s, tgt_input, s != pad_id, tgt_input != pad_id)
            loss = label_smoothed_loss(logits, tgt_out, smoothing, pad_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if callback is not None:
                callback(step, rate, losses[-1])
    model.train(training)
    return losses


def beam_search(model, memory, src_mask, bos, eos, max_len, beam_size, length_penalty):
    hyps = [[]]
    scores = [0.0]
    finished = []
    state = model.init_state(src_mask)
    for _ in range(max_len):
        last = torch.tensor([h[-1] if h else bos for h in hyps])
        logits, state = model.decode_step(last, memory.expand(len(hyps), -1, -1), state)
        logp = logits.log_softmax(-1)
        best, ids = logp.sort(dim=-1, descending=True, stable=True)
        cand = [
            (scores[i] + best[i, r].item(), i, ids[i, r].item())
            for i in range(len(hyps))
            for r in range(min(beam_size, logp.size(1)))
        ]
        cand.sort(key=lambda c: -c[0])
        new_hyps, new_scores, keep = [], [], []
        for score, i, tok in cand:
            if tok == eos:
                finished.append((score / (len(hyps[i]) + 1) ** length_penalty, hyps[i] + [tok]))
                continue
            new_hyps.append(hyps[i] + [tok])
            new_scores.append(score)
            keep.append(i)
            if len(new_hyps) == beam_size:
                break
        hyps, scores = new_hyps, new_scores
        if len(finished) >= beam_size or not hyps:
            break
        state = state.select(torch.tensor(keep))
    if not finished:
        finished = [(s / len(h) ** length_penalty, h) for h, s in zip(hyps, scores, strict=True)]
    top = 0
    for j in range(1, len(finished)):
        if finished[j][0] > finished[top][0]:
            top = j
    tokens = finished[top][1]
    return tokens[:-1] if tokens[-1] == eos else tokens


def translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0):
    if max_len > model.cfg.max_len:
        raise ValueError(f"max_len={max_len} is above the model's {model.cfg.max_len}")
    training = model.training
    model.eval()
    results = []
    with torch.no_grad():
        for i in range(src.size(0)):
            s = src[i : i + 1]
            mask = s != pad_id
            memory = model.encode(s, mask)
            results.append(
                beam_search(model, memory, mask, bos, eos, max_len, beam_size, length_penalty)
            )
    model.train(training)
    return results


def save_transformer(model, dir):
    os_dir = Path(dir)
    os_dir.mkdir(parents=True, exist_ok=True)
    (os_dir / "config.json").write_text(json.dumps(asdict(model.cfg), indent=1))
    weights = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, os_dir / "model.safetensors")


def load_transformer(dir):
    cfg = TransformerConfig(**json.loads((Path(dir) / "config.json").read_text()))
    weights = load_file(Path(dir) / "model.safetensors")
    model = Transformer(cfg)
    model.to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights)
    return model
