"""Shared pieces of the oracle's tests: tiny subject models, padded batches, comparisons.

Models are tiny (d_model 16, 2 + 2 layers) so the whole oracle suite stays fast; their LayerNorm
gains and biases are moved away from 1 and 0 so that a swapped or ignored one shows.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from hypothesis import strategies as st

from impl import torch_copy
from impl import transformer as impl

# (norm, tie_embeddings, src_vocab, tgt_vocab): both norms x the three ways tables are tied.
CASES = [
    (norm, tie, vs, vt)
    for norm in ("post", "pre")
    for tie, vs, vt in ((True, 11, 11), (True, 11, 13), (False, 11, 13), (False, 12, 12))
]
CASE_IDS = [f"{n}-{'tied' if t else 'untied'}-{vs}x{vt}" for n, t, vs, vt in CASES]


def make_model(
    norm: str = "post",
    tie: bool = True,
    src_vocab: int = 11,
    tgt_vocab: int = 11,
    *,
    module: ModuleType = impl,
    seed: int = 0,
    d_model: int = 16,
    n_heads: int = 4,
    d_ff: int = 24,
    n_enc: int = 2,
    n_dec: int = 2,
    max_len: int = 32,
) -> torch.nn.Module:
    """A float64 model in eval mode, built by `module` (impl.transformer or impl.torch_copy)."""
    torch.manual_seed(seed)
    cfg = module.TransformerConfig(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_enc=n_enc,
        n_dec=n_dec,
        norm=norm,
        tie_embeddings=tie,
        max_len=max_len,
    )
    model = module.Transformer(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def copy_of(model: torch.nn.Module) -> torch.nn.Module:
    """The torch copy (impl/torch_copy.py) with `model`'s weights, float64, eval mode."""
    twin = torch_copy.Transformer(model.cfg).double().eval()
    twin.load_state_dict(model.state_dict())
    return twin


def make_batch(cfg, seed: int = 0, B: int = 3, S: int = 7, T: int = 6):
    """(src, tgt_in, src_mask, tgt_mask) as torch tensors with padding in source and target.

    Row 1's source ends in padding, row 2's source is one real token; rows 0 and 2 of the target
    end in padding. Padded positions hold random ids too: nothing may read them.
    """
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, cfg.src_vocab, (B, S), generator=g)
    tgt = torch.randint(0, cfg.tgt_vocab, (B, T), generator=g)
    src_mask = torch.ones(B, S, dtype=torch.bool)
    tgt_mask = torch.ones(B, T, dtype=torch.bool)
    src_mask[1 % B, S - 3 :] = False
    src_mask[2 % B, 1:] = False
    tgt_mask[0, T - 3 :] = False
    tgt_mask[2 % B, T - 1 :] = False
    return src, tgt, src_mask, tgt_mask


def max_abs(a, b, mask=None) -> float:
    """max |a - b| over the positions where mask is True (all positions without a mask)."""
    diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    if mask is not None:
        diff = diff[np.asarray(mask)]
    return float(diff.max())


@st.composite
def tiny_configs(draw, norm=None, tie=None):
    """A drawn tiny config (a dict of TransformerConfig fields); a given argument pins it."""
    n_heads = draw(st.sampled_from([1, 2, 4]))
    src_vocab = draw(st.integers(3, 9))
    return dict(
        src_vocab=src_vocab,
        tgt_vocab=draw(st.sampled_from([src_vocab, src_vocab + 2])),
        # d_k >= 2 and d_model >= 4: LayerNorm over 2 features is +-1 whatever its input, so
        # nearly every gradient through it vanishes and the model is degenerate
        d_model=n_heads * draw(st.sampled_from([2, 4] if n_heads > 1 else [4])),
        n_heads=n_heads,
        d_ff=draw(st.integers(3, 12)),
        n_enc=draw(st.integers(1, 2)),
        n_dec=draw(st.integers(1, 2)),
        norm=draw(st.sampled_from(["post", "pre"])) if norm is None else norm,
        tie_embeddings=draw(st.booleans()) if tie is None else tie,
        max_len=16,
    )


def model_from(config: dict, seed: int, module: ModuleType = impl) -> torch.nn.Module:
    """make_model for a drawn config."""
    c = dict(config)
    return make_model(
        c.pop("norm"), c.pop("tie_embeddings"), c.pop("src_vocab"), c.pop("tgt_vocab"),
        module=module, seed=seed, **c,
    )  # fmt: skip
