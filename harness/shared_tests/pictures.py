"""The pictures of `xfmr check --html` (harness.reports.check_page draws them), measured on a
model through the probe calls of a worker, as plain data: which output positions depend on which
input positions (`Grid`), and each module's divergence from the oracle along the stack (`Bars`).

Every number comes back from the worker as plain data of two existing probes, and everything
is computed here, in the parent, as a law computes its verdict (the page only shows it; no
verdict depends on it):

- the dependence grids (`dependence`), when a masking test failed: the probe `forward_logits`
  (the masking laws' own) on one batch and on copies of it with one input position changed
  each (a target position, a source position, padded ones included, the masks unchanged); an
  output position reads an input position when its logits are not bitwise the same (the
  masking laws' own measure: a correct model gives the same bits where it must not read).
- the divergence bars (`divergence`), when a value test failed on a wrong value: the
  diagnosis itself (harness.shared_tests.diagnosis.diagnose, the probe `module_outputs`) with
  its walk kept (`Walk`): each judged module's error along the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.shared_tests.diagnosis import Walk, diagnose
from harness.shared_tests.diagnosis_answer import Finding
from harness.shared_tests.inputs import POST, batch, forward_inputs, pushed_weights
from harness.shared_tests.laws import SHARED_TESTS, masking
from harness.shared_tests.record import Call, Failure
from harness.shared_tests.verdicts import assert_holds

# The tests whose failure the grids picture: the masking laws.
MASKING = frozenset(t.name for t in SHARED_TESTS if t.check.__module__ == masking.__name__)
# The measured batch: row 0 is pictured, its target all real, its source REAL real positions
# then padding up to the longer row 1's.
TARGET, SOURCE, REAL = 7, 8, 5


@dataclass(frozen=True)
class Grid:
    """Which outputs read which inputs: `reads[i][j]` when changing input position j alone moved
    output position i; `allowed[i][j]` when the contract lets output i read input j. `rows` and
    `cols` label the positions (a padded one says so)."""

    key: str  # the picture's id on the page: "targets", "source"
    title: str
    caption: str
    rows: list[str]
    cols: list[str]
    reads: list[list[bool]]
    allowed: list[list[bool]]
    # per output position: its logits are finite on the unchanged batch (a NaN or inf output
    # cannot show what it reads: its row is drawn as not finite); empty: every one is
    finite: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        shape = (len(self.rows), len(self.cols))
        if self.finite and len(self.finite) != shape[0]:
            raise ValueError(f"Grid {self.key}: finite has {len(self.finite)} rows, not {shape[0]}")
        for what, m in (("reads", self.reads), ("allowed", self.allowed)):
            if len(m) != shape[0] or any(len(row) != shape[1] for row in m):
                raise ValueError(f"Grid {self.key}: {what} is not {shape[0]} x {shape[1]}")

    def row_finite(self, i: int) -> bool:
        return not self.finite or self.finite[i]

    @property
    def forbidden_reads(self) -> list[tuple[int, int]]:
        """The (output, input) cells the model reads where the contract forbids it."""
        return [
            (i, j)
            for i, row in enumerate(self.reads)
            for j, read in enumerate(row)
            if read and not self.allowed[i][j] and self.row_finite(i)
        ]


@dataclass(frozen=True)
class Bar:
    """One judged point of the forward pass: its relative error against the contract's value
    (inf: not comparable), whether it departs (returns none of the accepted forms) and its cause
    when the diagnosis established one."""

    where: str
    error: float
    departs: bool
    cause: str = ""
    whole: bool = False  # the logits against the oracle's whole forward pass (not re-anchored)


@dataclass(frozen=True)
class Bars:
    """One config's judged points in order, and the walk's relative tolerance."""

    config: str
    bars: list[Bar]
    tol: float

    @property
    def first(self) -> int | None:
        """The index of the first divergent point (the diagnosis's first divergence)."""
        return next((i for i, b in enumerate(self.bars) if b.departs), None)


def other_token(token: int, vocab: int) -> int:
    """A real token (3..vocab-1) other than `token`: the next one, or 3 for a special id."""
    return (token - 3 + 1) % (vocab - 3) + 3 if token >= 3 else 3


def moved(got: Any, ref: np.ndarray) -> np.ndarray:
    """Per output position of row 0: whether its logits differ from `ref`'s in any bit (NaN where
    `ref` has NaN counts as the same)."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        raise Failure(f"forward_logits gave logits of shape {got.shape}, expected {ref.shape}")
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    return ~same[0].all(axis=-1)


def dependence(call: Call) -> list[Grid]:
    """The two grids of the post-LN config: targets -> outputs (the decoder's causal mask),
    source -> outputs (the source padding mask), measured on row 0."""
    cfg = POST
    weights = pushed_weights(call, [cfg], "dependence picture")[0]
    base = forward_inputs(
        batch(np.random.default_rng(5), cfg, src_lens=[REAL, SOURCE], tgt_lens=[TARGET, TARGET])
    )
    variants = [base]
    for key, n, vocab in (("tgt_in", TARGET, cfg["tgt_vocab"]), ("src", SOURCE, cfg["src_vocab"])):
        for j in range(n):
            ids = base[key].copy()
            ids[0, j] = other_token(int(ids[0, j]), vocab)
            variants.append({**base, key: ids})
    r = call("forward_logits", cfg=cfg, weights=weights, batches=variants)
    if not isinstance(r, dict) or not isinstance(r.get("logits"), list):
        raise Failure(f"forward_logits gave a {type(r).__name__}, not its answer")
    assert_holds("post-LN", r.get("state_dict"), weights)
    if len(r["logits"]) != len(variants):
        raise Failure(f"forward_logits gave {len(r['logits'])} logits for {len(variants)} batches")
    ref = np.asarray(r["logits"][0])
    if ref.ndim != 3 or ref.shape[:2] != (2, TARGET):
        raise Failure(f"forward_logits gave logits of shape {ref.shape}, expected (2, {TARGET}, V)")
    changes = [moved(got, ref) for got in r["logits"][1:]]
    finite = [bool(x) for x in np.isfinite(ref[0]).all(axis=-1)]
    by_target, by_source = changes[:TARGET], changes[TARGET:]
    outputs = [f"out {i}" for i in range(TARGET)]
    return [
        Grid(
            "targets",
            "Which target positions each output position reads (the decoder's causal mask)",
            "Rows: the output (logits) at each target position; columns: the target token "
            "changed alone (position 0 is bos). The contract's decoder is causal: the output at "
            "position i reads the targets at positions 0..i only.",
            outputs,
            [f"tgt {j}" for j in range(TARGET)],
            [[bool(by_target[j][i]) for j in range(TARGET)] for i in range(TARGET)],
            [[j <= i for j in range(TARGET)] for i in range(TARGET)],
            finite,
        ),
        Grid(
            "source",
            "Which source positions each output position reads (the source padding mask)",
            f"Rows: the output (logits) at each target position; columns: the source token "
            f"changed alone, the masks unchanged; positions {REAL}..{SOURCE - 1} are padding. The "
            "contract's model reads every real source position and never a padded one.",
            outputs,
            [f"src {j}" if j < REAL else f"src {j} (pad)" for j in range(SOURCE)],
            [[bool(by_source[j][i]) for j in range(SOURCE)] for i in range(TARGET)],
            [[j < REAL for j in range(SOURCE)] for _ in range(TARGET)],
            finite,
        ),
    ]


def bar(f: Finding, last: bool) -> Bar:
    """A judged point as a bar: the last one is the logits, whose error is against the oracle's
    whole forward pass where the output layer computes the contract's function of its input."""
    return Bar(f.where, f.error, f.departs, f.cause, whole=last and not f.departs)


def divergence(call: Call) -> list[Bars]:
    """Each golden config's walk (the diagnosis's), as bars; a config the diagnosis could not
    walk has none."""
    walks: dict[str, Walk] = {}
    diagnose(call, walks)
    return [
        Bars(name, [bar(f, i == len(w.points) - 1) for i, f in enumerate(w.points)], w.tol)
        for name, w in walks.items()
        if w.points
    ]


def measure(call: Call, grids: bool, bars: bool) -> tuple[list[Grid], list[Bars], list[str]]:
    """The pictures asked for, measured through `call`, and a note for each that could not be
    (why). What the worker raises (the subject's exception, a worker that died) is the
    caller's to say."""
    found: tuple[list[Grid], list[Bars], list[str]] = ([], [], [])
    if bars:  # first: the diagnosis never raises
        found[1].extend(divergence(call))
        if not found[1]:
            found[2].append(
                "The divergence bars could not be drawn: the diagnosis did not walk the forward "
                "pass (its sentence says why)."
            )
    if grids:
        try:
            found[0].extend(dependence(call))
        except (Failure, ValueError, TypeError) as e:
            found[2].append(f"The dependence grids could not be measured: {e}")
    return found
