"""Calibrate the float32 tolerances: `python -m harness.tools.calibrate [--write]`.

A subject that cannot run in float64 is compared in float32. Its honest error is what the
correct torch copy shows in float32 on the golden test's inputs: this measures the largest
relative error of each kind (logits, loss, gradients) and stores it times SAFETY_FACTOR in
harness/data/float32_tolerance.json.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from harness.engine.run import trusted_call
from harness.shared_tests.inputs import DATA
from harness.shared_tests.laws.values import golden_comparisons
from harness.shared_tests.verdicts import errors
from harness.subjects import Kind, Subject

# float32 rounding varies with the weights and inputs drawn; 10x the worst measured error keeps
# a correct float32 subject clear of it while a real fault (errors of 1e-3 and up) still fails.
SAFETY_FACTOR = 10.0


def measure() -> dict[str, float]:
    """The float32 torch copy's largest relative error of each kind against the oracle."""
    worst: dict[str, float] = {}
    with trusted_call(Subject("torch_copy", Kind.CORRECT, module="impl.torch_copy")) as call:
        for _, _, kind, got, want, mask, _ in golden_comparisons(call, "float32"):
            err, scale = errors(np.asarray(got, dtype=np.float64), np.asarray(want), mask)
            worst[kind] = max(worst.get(kind, 0.0), float(err.max()) / scale)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write float32_tolerance.json")
    args = parser.parse_args(argv)
    worst = measure()
    tolerance = {kind: err * SAFETY_FACTOR for kind, err in worst.items()}
    # a float32 cache or padding reorders sums at the level float32 rounds logits
    tolerance["reorder"] = tolerance["logits"]
    result = {
        "measured": worst,
        "safety_factor": SAFETY_FACTOR,
        "tolerance": tolerance,
        "derivation": "largest relative error (|got - want| / max(1, max|want|)) of the float32 "
        "torch copy vs the oracle on test_golden_torch's inputs, times the safety factor; "
        "reorder = logits; python -m harness.tools.calibrate --write",
    }
    print(json.dumps(result, indent=2))
    if args.write:
        (DATA / "float32_tolerance.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
