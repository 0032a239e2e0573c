# The contract every subject implements (see CONTRACT.md for the semantics).
from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

import torch
from torch import Tensor

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
    norm: Literal["post", "pre"] = "post"
    tie_embeddings: bool = True
    max_len: int = 256
    ln_eps: float = 1e-5

DecodeState = Any  # opaque: position, source mask and the KV cache; never mutated by decode_step

class Transformer(torch.nn.Module):
    cfg: TransformerConfig
    def __init__(self, cfg: TransformerConfig) -> None: ...
    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor: ...  # [B, S, d]
    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor
    ) -> Tensor: ...  # logits [B, T, V_tgt]
    def forward(
        self, src: Tensor, tgt_in: Tensor, src_mask: Tensor, tgt_mask: Tensor
    ) -> Tensor: ...  # logits [B, T, V_tgt]
    def init_state(self, src_mask: Tensor) -> DecodeState: ...
    def decode_step(
        self, y_prev: Tensor, memory: Tensor, state: DecodeState
    ) -> tuple[Tensor, DecodeState]: ...  # logits [B, V_tgt] of the state's position

def label_smoothed_loss(logits: Tensor, targets: Tensor, eps: float, pad_id: int) -> Tensor: ...
def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float: ...
def make_optimizer(model: Transformer) -> torch.optim.Adam: ...
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
) -> list[float]: ...
def translate(
    model: Transformer,
    src: Tensor,
    bos: int,
    eos: int,
    pad_id: int,
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
) -> list[list[int]]: ...
def save_transformer(model: Transformer, dir: str | PathLike[str]) -> None: ...
def load_transformer(dir: str | PathLike[str]) -> Transformer: ...
