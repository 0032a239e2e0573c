"""What the oracle computes with: a model's shape (ModelSpec) and its arrays (Params)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from oracle.ops import ACTIVATIONS, FLOATS, positional_encoding

NORMS = ("post", "pre")
# How the embedding tables and the output layer share arrays (CONTRACT.md, "state_dict names"):
# 'all': src_emb.weight is all three; 'tgt_out': tgt_emb.weight is also the output layer; 'none'.
TIES = ("all", "tgt_out", "none")


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """Everything about a model that is not a trained parameter."""

    d_model: int
    n_heads: int
    d_ff: int
    n_enc: int
    n_dec: int
    norm: str  # 'post': x <- LN(x + F(x)); 'pre': x <- x + F(LN(x)) and a final LN per stack
    ln_eps: float
    src_vocab: int
    tgt_vocab: int
    max_len: int
    tie: str  # one of TIES
    # Knobs for checkpoints that are not the paper's (Marian): the paper's values by default.
    activation: str = "relu"  # 'relu', 'gelu' (exact erf form) or 'silu'
    embed_scale: float | None = None  # None: sqrt(d_model)
    pos_table: np.ndarray | None = None  # None: the interleaved sinusoid; else [max_len, d] as is
    logits_bias: np.ndarray | None = None  # added to the logits; None: no bias (the contract)

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.tie not in TIES:
            raise ValueError(f"tie must be one of {TIES}, got {self.tie!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {tuple(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.n_heads < 1 or self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be positive and divide d_model={self.d_model}"
            )
        if self.pos_table is not None and self.pos_table.shape != (self.max_len, self.d_model):
            raise ValueError(
                f"pos_table has shape {self.pos_table.shape}, "
                f"expected (max_len, d_model) = {(self.max_len, self.d_model)}"
            )
        if self.logits_bias is not None and self.logits_bias.shape != (self.tgt_vocab,):
            raise ValueError(
                f"logits_bias has shape {self.logits_bias.shape}, expected ({self.tgt_vocab},)"
            )

    @property
    def scale(self) -> float:
        """The factor on embedded ids: sqrt(d_model) in the paper (section 3.4)."""
        return math.sqrt(self.d_model) if self.embed_scale is None else self.embed_scale


@dataclass(frozen=True, eq=False)
class Params:
    """A model's parameters: `arrays` maps the contract's state_dict names to float64 arrays.

    A tied table is stored once, under the name the contract lists it by; `src_table`, `tgt_table`
    and `out_table` name the array each use reads.
    """

    spec: ModelSpec
    arrays: dict[str, np.ndarray]
    scheme: str = "contract"  # the naming scheme the arrays were read from

    def __post_init__(self) -> None:
        dtypes = {a.dtype for a in self.arrays.values()}
        if not dtypes <= set(FLOATS) or len(dtypes) > 1:
            raise TypeError(f"Params arrays must all be float64 or all longdouble, got {dtypes}")

    @property
    def dtype(self) -> np.dtype:
        return self.arrays["src_emb.weight"].dtype

    @property
    def src_table(self) -> str:
        return "src_emb.weight"

    @property
    def tgt_table(self) -> str:
        return "src_emb.weight" if self.spec.tie == "all" else "tgt_emb.weight"

    @property
    def out_table(self) -> str:
        return {"all": "src_emb.weight", "tgt_out": "tgt_emb.weight", "none": "out.weight"}[
            self.spec.tie
        ]

    def pe(self, length: int) -> np.ndarray:
        """The positional table's first `length` rows [length, d], in the arrays' dtype."""
        if length > self.spec.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.spec.max_len}")
        if self.spec.pos_table is not None:
            return self.spec.pos_table[:length].astype(self.dtype)
        return positional_encoding(length, self.spec.d_model, self.dtype)

    def layer(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays under `prefix.`, prefix removed: layer('encoder.0')['norm1.weight']."""
        head = prefix + "."
        return {k[len(head) :]: v for k, v in self.arrays.items() if k.startswith(head)}

    def astype(self, dtype: np.dtype) -> Params:
        """The same model in another real dtype (np.longdouble for the error-budget test)."""
        spec = self.spec
        if spec.pos_table is not None or spec.logits_bias is not None:
            spec = dataclasses.replace(
                spec,
                pos_table=None if spec.pos_table is None else spec.pos_table.astype(dtype),
                logits_bias=None if spec.logits_bias is None else spec.logits_bias.astype(dtype),
            )
        arrays = {k: v.astype(dtype) for k, v in self.arrays.items()}
        return Params(spec, arrays, self.scheme)
