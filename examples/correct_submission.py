"""A student's transformer.py: the encoder-decoder Transformer of Vaswani et al. (2017) in plain
torch, written to the course contract (CONTRACT.md).

The correct example submission of README.md's grading walkthrough; faulty_submission.py is the
same student's file with one line changed (diff the two to see the fault).
"""

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
    norm: str = "post"  # "post": LN(x + F(x)); "pre": x + F(LN(x)) and one LN after each stack
    tie_embeddings: bool = True
    max_len: int = 256
    ln_eps: float = 1e-5

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


def sinusoids(positions, d):
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (section 3.5)."""
    two_i = torch.arange(0, d, 2, dtype=torch.float64, device=positions.device)
    angles = positions.double()[:, None] / 10000.0 ** (two_i / d)  # [L, ceil(d/2)]
    pe = torch.zeros(len(positions), d, dtype=torch.float64, device=positions.device)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()[:, : d // 2]
    return pe


def check_bool(mask, name):
    if not torch.is_tensor(mask) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {getattr(mask, 'dtype', mask)}")


def check_ids(ids, mask, name, max_len):
    """Padding masks are bool, shaped like their ids, and no sequence is over max_len."""
    check_bool(mask, f"{name}_mask")
    if mask.shape != ids.shape:
        raise ValueError(f"{name}_mask has shape {tuple(mask.shape)} but {name} {tuple(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, more than max_len={max_len}")


def check_source_mask(src_mask):
    check_bool(src_mask, "src_mask")
    empty = (~src_mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"source rows {empty} have no real token")


def split_heads(x, h):
    B, L, d = x.shape
    return x.view(B, L, h, d // h).transpose(1, 2)  # [B, h, L, d_k]


class MultiHeadAttention(nn.Module):
    """Concat(head_1..head_h) W^O, head_i = softmax(Q_i K_i^T / sqrt(d_k) + mask) V_i (3.2)."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.h = cfg.n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))
        self.drop = nn.Dropout(cfg.dropout)

    def keys_values(self, x):
        return split_heads(self.k_proj(x), self.h), split_heads(self.v_proj(x), self.h)

    def forward(self, x, memory=None, allowed=None, kv=None):
        """x [B, T, d] attends to memory [B, S, d], or to given heads kv; allowed [B, 1|T, S]."""
        k, v = self.keys_values(memory) if kv is None else kv
        q = split_heads(self.q_proj(x), self.h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, h, T, S]
        if allowed is not None:
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        heads = self.drop(scores.softmax(dim=-1)) @ v  # [B, h, T, d_k]
        B, _, T, _ = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, -1))


class Layer(nn.Module):
    """What encoder and decoder layers share: the residual sublayer and the feed-forward net."""

    def __init__(self, cfg):
        super().__init__()
        self.pre_ln = cfg.norm == "pre"
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def feed_forward(self, x):
        return self.linear2(self.drop(F.relu(self.linear1(x))))

    def sublayer(self, x, f, norm):
        """post-LN: LN(x + Dropout(f(x))); pre-LN: x + Dropout(f(LN(x)))."""
        if self.pre_ln:
            return x + self.drop(f(norm(x)))
        return norm(x + self.drop(f(x)))


class EncoderLayer(Layer):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn = MultiHeadAttention(cfg)
        self.norm1, self.norm2 = (nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) for _ in range(2))

    def forward(self, x, src_allowed):
        x = self.sublayer(x, lambda z: self.self_attn(z, z, src_allowed), self.norm1)
        return self.sublayer(x, self.feed_forward, self.norm2)


class DecoderLayer(Layer):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.norm1, self.norm2, self.norm3 = (
            nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) for _ in range(3)
        )

    def forward(self, y, memory, tgt_allowed, src_allowed, past=None):
        """y [B, T, d] -> (output, self-attention keys and values of every position so far).

        `past` holds the keys and values of the positions before y (decoding with a cache).
        """
        cache = []

        def self_attention(z):
            k, v = self.self_attn.keys_values(z)
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            cache.append((k, v))
            return self.self_attn(z, kv=(k, v), allowed=tgt_allowed)

        y = self.sublayer(y, self_attention, self.norm1)
        y = self.sublayer(y, lambda z: self.cross_attn(z, memory, src_allowed), self.norm2)
        return self.sublayer(y, self.feed_forward, self.norm3), cache[0]


@dataclass(frozen=True)
class DecodeState:
    pos: int  # the position the next decode_step computes
    src_mask: torch.Tensor  # [B, S]
    kv: tuple  # per decoder layer: self-attention (keys, values) [B, h, pos, d_k], or None

    def select(self, rows):
        """The state of hypotheses `rows` (beam search keeps some and repeats others)."""
        kv = tuple((k[rows], v[rows]) for k, v in self.kv)
        return DecodeState(self.pos, self.src_mask[rows], kv)


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {cfg.norm!r}")
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        self.cfg = cfg
        d = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab, d)
        tables = [self.src_emb]
        if not (cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab):
            self.tgt_emb = nn.Embedding(cfg.tgt_vocab, d)
            tables.append(self.tgt_emb)
        for table in tables:  # N(0, 1/d): E * sqrt(d) then has the scale of PE
            nn.init.normal_(table.weight, std=d**-0.5)
        if not cfg.tie_embeddings:
            self.out = nn.Linear(d, cfg.tgt_vocab, bias=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec))
        if cfg.norm == "pre":
            self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps)
            self.dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def tgt_table(self):
        return self.tgt_emb.weight if hasattr(self, "tgt_emb") else self.src_emb.weight

    def embed(self, ids, table, start=0):
        """E[ids] * sqrt(d_model) + PE, positions from `start` (sections 3.4 and 3.5)."""
        d = self.cfg.d_model
        x = F.embedding(ids, table) * math.sqrt(d)
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        return self.drop(x + sinusoids(positions, d).to(x.dtype))

    def logits(self, y):
        if self.cfg.norm == "pre":
            y = self.dec_norm(y)
        return F.linear(y, self.out.weight if hasattr(self, "out") else self.tgt_table())

    def encode(self, src, src_mask):
        check_ids(src, src_mask, "src", self.cfg.max_len)
        check_source_mask(src_mask)
        x = self.embed(src, self.src_emb.weight)
        for layer in self.encoder:
            x = layer(x, src_mask[:, None, :])
        return self.enc_norm(x) if self.cfg.norm == "pre" else x

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        check_ids(tgt_in, tgt_mask, "tgt", self.cfg.max_len)
        check_source_mask(src_mask)
        if memory.shape[:2] != src_mask.shape or len(memory) != len(tgt_in):
            shapes = [tuple(t.shape) for t in (memory, src_mask, tgt_in)]
            raise ValueError(f"memory, src_mask and tgt_in disagree on B or S: shapes {shapes}")
        if not tgt_mask[:, 0].all():
            raise ValueError("every target row must start with a real token (bos)")
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()
        allowed = causal[None] & tgt_mask[:, None, :]  # [B, T, T]: key j <= t and real
        y = self.embed(tgt_in, self.tgt_table())
        for layer in self.decoder:
            y, _ = layer(y, memory, allowed, src_mask[:, None, :])
        return self.logits(y)

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, tgt_mask)

    def init_state(self, src_mask):
        check_source_mask(src_mask)
        return DecodeState(0, src_mask, (None,) * self.cfg.n_dec)

    def decode_step(self, y_prev, memory, state):
        """Logits [B, V] of position state.pos, whose input token is y_prev [B]."""
        if y_prev.shape != state.src_mask.shape[:1]:
            raise ValueError(f"y_prev must have shape [{len(state.src_mask)}], got {y_prev.shape}")
        if state.pos >= self.cfg.max_len:
            raise ValueError(f"position {state.pos} is past max_len={self.cfg.max_len}")
        if memory.shape[:2] != state.src_mask.shape:
            raise ValueError(f"memory {tuple(memory.shape)} does not fit the state's src_mask")
        y = self.embed(y_prev[:, None], self.tgt_table(), start=state.pos)  # [B, 1, d]
        kv = []
        for layer, past in zip(self.decoder, state.kv, strict=True):
            y, layer_kv = layer(y, memory, None, state.src_mask[:, None, :], past)
            kv.append(layer_kv)
        return self.logits(y)[:, 0], DecodeState(state.pos + 1, state.src_mask, tuple(kv))


def label_smoothed_loss(logits, targets, eps, pad_id):
    """Mean over non-pad targets of -sum_j q_j log p_j, q = (1 - eps) onehot(t) + eps / V."""
    logp = logits.log_softmax(dim=-1)
    real = targets != pad_id
    nll = -logp.gather(-1, torch.where(real, targets, 0)[..., None])[..., 0]
    loss = (1 - eps) * nll - eps * logp.mean(dim=-1)
    return (loss * real).sum() / real.sum()


def noam_rate(step, d_model, warmup, factor=1.0):
    """factor * d^-0.5 * min(n^-0.5, n * warmup^-1.5), n = step + 1 (section 5.3)."""
    n = step + 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)


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
    """`steps` Adam updates on shuffled batches: read tgt[:, :-1], predict tgt[:, 1:]."""
    if len(src) != len(tgt):
        raise ValueError(f"src has {len(src)} rows, tgt {len(tgt)}")
    torch.manual_seed(seed)  # dropout: the same seed gives the same losses
    shuffle = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer(model)
    was_training = model.training
    model.train()
    losses, queue = [], []
    for step in range(steps):
        if len(queue) < batch:  # a new epoch; the last short batch of the old one is dropped
            queue = torch.randperm(len(src), generator=shuffle)
        rows, queue = queue[:batch], queue[batch:]
        rate = lr if lr is not None else noam_rate(step, model.cfg.d_model, warmup, factor)
        for group in optimizer.param_groups:
            group["lr"] = rate
        x, y = src[rows], tgt[rows]
        logits = model(x, y[:, :-1], x != pad_id, y[:, :-1] != pad_id)
        loss = label_smoothed_loss(logits, y[:, 1:], smoothing, pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, rate, losses[-1])
    model.train(was_training)
    return losses


def beam_search(model, memory, src_mask, bos, eos, max_len, beam_size, length_penalty):
    """CONTRACT.md's pinned beam search for one source row (memory [1, S, d])."""
    hyps = [((), 0.0, 0)]  # live hypotheses: (tokens, log-probability, parent row)
    done = []  # finished: (score, tokens with eos)
    state = model.init_state(src_mask)
    for _ in range(max_len):
        last = torch.tensor([tokens[-1] if tokens else bos for tokens, *_ in hyps])
        logits, state = model.decode_step(last, memory.expand(len(hyps), -1, -1), state)
        logp, ids = logits.double().log_softmax(-1).sort(dim=-1, descending=True, stable=True)
        k = min(beam_size, logp.shape[1])
        options = [
            (hyps[i][1] + logp[i, r].item(), i, ids[i, r].item())
            for i in range(len(hyps))
            for r in range(k)
        ]
        options.sort(key=lambda o: -o[0])  # stable: hypothesis order, then token rank
        kept = []
        for total, i, token in options:
            tokens = hyps[i][0] + (token,)
            if token != eos:
                kept.append((tokens, total, i))
            else:
                done.append((total / len(tokens) ** length_penalty, tokens))
            if len(kept) == beam_size:
                break
        hyps = kept
        if len(done) >= beam_size or not hyps:
            break
        state = state.select(torch.tensor([parent for *_, parent in hyps]))
    if not done:
        done = [
            (total / max(len(tokens), 1) ** length_penalty, tokens) for tokens, total, _ in hyps
        ]
    best = max(done, key=lambda d: d[0])[1]  # max keeps the first of equal scores
    return [token for token in best if token != eos]


def translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0):
    """Beam search for every source row; beam_size=1 is greedy decoding."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        src_mask = src != pad_id
        memory = model.encode(src, src_mask)
        rows = zip(memory.split(1), src_mask.split(1), strict=True)
        settings = (bos, eos, max_len, beam_size, length_penalty)
        out = [beam_search(model, m, mask, *settings) for m, mask in rows]
    model.train(was_training)
    return out


def save_transformer(model, dir):
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(asdict(model.cfg)))
    save_file(model.state_dict(), path / "model.safetensors")  # a tied table is listed once


def load_transformer(dir):
    path = Path(dir)
    cfg = TransformerConfig(**json.loads((path / "config.json").read_text()))
    weights = load_file(path / "model.safetensors")
    model = Transformer(cfg).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights)
    return model
