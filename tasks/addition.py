"""Reversed addition, the milestone task MS-L5: "123+456" -> 9, 7, 5 (least significant first).

Writing the answer least significant first lets the decoder produce each digit after the carry
it depends on, so every output digit needs attention to two source digits and one earlier output.

Tokenization (one vocabulary shared by source and target):

| id | token | id | token |
| --- | --- | --- | --- |
| 0 | pad | 3 | '+' |
| 1 | bos | 4 + k | digit k (k = 0..9) |
| 2 | eos | | |

- Operands have exactly `digits` digits (10^(n-1) .. 10^n - 1; 0 .. 9 when n = 1), so every source
  is the sum as written, most significant digit first, S = 2n + 1 tokens, never padded.
- The target is bos, the answer's digits least significant first (no leading zeros), eos, then pad
  up to T + 2 = n + 3 tokens, T = n + 1 being the longest answer.
- The split is seeded and made on sums: a+b and b+a count as the same sum (addition commutes, so a
  model that saw b+a has seen the answer to a+b), and no held-out sum appears in training in
  either order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # torch is imported where tensors are made: the harness reads the numpy arrays
    import torch

PAD, BOS, EOS, PLUS = 0, 1, 2, 3
DIGIT0 = 4  # digit k is token DIGIT0 + k
VOCAB = DIGIT0 + 10
TOKENS = ("<pad>", "<bos>", "<eos>", "+", *"0123456789")


def operand_range(digits: int) -> range:
    """The operands with exactly `digits` digits (0..9 for one digit)."""
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits must be a positive int, got {digits!r}")
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def source_len(digits: int) -> int:
    """S = 2n + 1: two n-digit operands and '+'."""
    return 2 * digits + 1


def target_len(digits: int) -> int:
    """T + 2 = n + 3: bos, at most n + 1 answer digits, eos."""
    return digits + 3


def encode_source(text: str) -> list[int]:
    """Token ids of a sum written with digits and '+', e.g. "123+456"."""
    ids = []
    for ch in text:
        if ch == "+":
            ids.append(PLUS)
        elif ch in "0123456789":
            ids.append(DIGIT0 + int(ch))
        else:
            raise ValueError(f"cannot tokenize {ch!r} in {text!r}: expected digits and '+'")
    return ids


def parse_sum(text: str, digits: int) -> tuple[int, int]:
    """(a, b) from "a+b", both operands with exactly `digits` digits as the task writes them."""
    parts = text.strip().split("+")
    ok = len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts)
    if not ok:
        raise ValueError(f"expected a sum like '123+456', got {text!r}")
    valid = operand_range(digits)
    for p in parts:
        if len(p) != digits or int(p) not in valid:
            raise ValueError(
                f"operand {p!r} in {text!r} is not a {digits}-digit number; this task's operands "
                f"run from {valid.start} to {valid.stop - 1}"
            )
    return int(parts[0]), int(parts[1])


def answer_tokens(total: int) -> list[int]:
    """The answer's digits, least significant first, as token ids (no bos, no eos)."""
    return [DIGIT0 + int(ch) for ch in reversed(str(total))]


def decode_answer(tokens: Sequence[int]) -> str:
    """The answer in normal digit order from its reversed digit tokens; '?' marks a non-digit."""
    return "".join(
        str(t - DIGIT0) if DIGIT0 <= t < DIGIT0 + 10 else "?" for t in reversed(list(tokens))
    )


def decode_tokens(ids: Sequence[int]) -> str:
    """Any ids as readable text (for messages): "<bos>9750<eos><pad>"."""
    return "".join(TOKENS[i] if 0 <= i < VOCAB else f"<{i}?>" for i in ids)


def _check_pairs(pairs: npt.ArrayLike, digits: int) -> np.ndarray:
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    ops = operand_range(digits)
    bad = (pairs < ops.start) | (pairs >= ops.stop)
    if bad.any():
        a, b = pairs[np.argwhere(bad)[0][0]]
        raise ValueError(f"{a}+{b} has an operand outside the {digits}-digit range {ops}")
    return pairs


def source_array(pairs: npt.ArrayLike, digits: int) -> np.ndarray:
    """Sources of the sums in `pairs` [N, 2] -> int64 [N, 2n + 1], most significant first."""
    pairs = _check_pairs(pairs, digits)
    place = 10 ** np.arange(digits - 1, -1, -1)  # most significant digit first
    a = DIGIT0 + pairs[:, :1] // place % 10
    b = DIGIT0 + pairs[:, 1:] // place % 10
    plus = np.full((len(pairs), 1), PLUS)
    return np.concatenate([a, plus, b], axis=1)


def encode_sources(pairs: npt.ArrayLike, digits: int) -> torch.Tensor:
    """source_array as a LongTensor [N, 2n + 1]."""
    import torch

    return torch.from_numpy(source_array(pairs, digits))


def encode_targets(pairs: npt.ArrayLike, digits: int) -> torch.Tensor:
    """target_array as a LongTensor [N, n + 3]."""
    import torch

    return torch.from_numpy(target_array(pairs, digits))


def target_array(pairs: npt.ArrayLike, digits: int) -> np.ndarray:
    """Targets bos, reversed answer digits, eos, pad... -> int64 [N, n + 3]."""
    pairs = _check_pairs(pairs, digits)
    total = pairs.sum(axis=1, keepdims=True)
    n_out = 1 + (total >= 10 ** np.arange(1, digits + 1)).sum(axis=1, keepdims=True)
    pos = np.arange(digits + 1)  # answer digit i is the 10^i place
    out = np.where(pos < n_out, DIGIT0 + total // 10**pos % 10, PAD)
    out = np.concatenate([np.full((len(pairs), 1), BOS), out, np.full((len(pairs), 1), PAD)], 1)
    out[np.arange(len(pairs)), 1 + n_out[:, 0]] = EOS  # right after the answer's last digit
    return out


def target_answer(row: Sequence[int]) -> list[int]:
    """The answer digits of one target row: what lies between bos and eos."""
    row = list(row)
    if not row or row[0] != BOS or EOS not in row:
        raise ValueError(f"not a target row (bos ... eos): {decode_tokens(row)}")
    return row[1 : row.index(EOS)]


def exact_match(predictions: Sequence[Sequence[int]], tgt: torch.Tensor) -> float:
    """Fraction of rows whose predicted tokens (no bos, no eos) equal the target's answer."""
    if len(predictions) != len(tgt):
        raise ValueError(f"{len(predictions)} predictions for {len(tgt)} targets")
    if len(tgt) == 0:
        raise ValueError("exact match of zero examples is undefined")
    hits = sum(list(p) == target_answer(t) for p, t in zip(predictions, tgt.tolist(), strict=True))
    return hits / len(tgt)


def split_sums(
    digits: int, n_test: int, n_train: int | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, test) pairs [N, 2]; no test sum appears in training, in either order.

    The test set holds `n_test` distinct sums (never both a+b and b+a). Training holds `n_train`
    distinct ordered pairs drawn from the rest, or all of the rest when `n_train` is None.
    """
    ops = operand_range(digits)
    k = len(ops)
    total = k * k
    if n_test < 1 or (n_train is not None and n_train < 1):
        raise ValueError(f"n_test and n_train must be positive, got {n_test} and {n_train}")
    # each test sum removes at most two ordered pairs, so this many draws always suffice
    want = total if n_train is None else min(total, 2 * n_test + n_train)
    rng = np.random.default_rng(seed)
    stream = rng.choice(total, size=want, replace=False)
    a, b = stream // k, stream % k
    key = np.minimum(a, b) * k + np.maximum(a, b)  # one key per unordered sum

    head = min(want, 2 * n_test)  # enough draws to find n_test distinct sums
    _, first = np.unique(key[:head], return_index=True)
    test_idx = np.sort(first)[:n_test]
    if len(test_idx) < n_test:
        raise ValueError(f"only {len(test_idx)} distinct {digits}-digit sums; asked for {n_test}")
    held = np.isin(key, key[test_idx])
    train_idx = np.flatnonzero(~held)
    if n_train is not None:
        if len(train_idx) < n_train:
            raise ValueError(
                f"only {len(train_idx)} training pairs remain for {digits} digits; asked {n_train}"
            )
        train_idx = train_idx[:n_train]
    pairs = np.stack([a + ops.start, b + ops.start], axis=1).astype(np.int64)
    return pairs[train_idx], pairs[test_idx]


@dataclass(frozen=True)
class AdditionData:
    """The contract's tensors for one seeded split: src [N, S], tgt [N, T + 2], and the ids."""

    digits: int
    train_pairs: np.ndarray
    test_pairs: np.ndarray
    train_src: torch.Tensor
    train_tgt: torch.Tensor
    test_src: torch.Tensor
    test_tgt: torch.Tensor
    pad: int = PAD
    bos: int = BOS
    eos: int = EOS
    vocab: int = VOCAB


def load(digits: int, n_test: int, n_train: int | None = None, seed: int = 0) -> AdditionData:
    """Split the n-digit sums (see split_sums) and encode both sides."""
    train, test = split_sums(digits, n_test, n_train, seed)
    return AdditionData(
        digits=digits,
        train_pairs=train,
        test_pairs=test,
        train_src=encode_sources(train, digits),
        train_tgt=encode_targets(train, digits),
        test_src=encode_sources(test, digits),
        test_tgt=encode_targets(test, digits),
    )
