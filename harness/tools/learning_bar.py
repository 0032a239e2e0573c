"""Derive the learning test's bar from impl: `python -m harness.tools.learning_bar [--write]`.

`--stops N` instead runs the learning test's own run (judged at every checkpoint against the
bar) for impl and the torch copy on N secret instances, and prints where each stopped: the
updates the test costs a correct subject.

impl trains on two-digit reversed addition with the recipe below under each of five seeds, each
run on its own secret instance of the task from the parent's weights, exactly as the learning
test runs (the draws' secret fixed at DRAW_SECRET, so the derivation is reproducible); the bar
is the worst held-out loss times MARGIN. A correct subject's run is one more draw from the
same spread of seeds; a subject that cannot learn the task stays near the loss of guessing
digits, log 10 = 2.3, far above it. The bar must also lie below what a model blind to the
source can reach: the derivation computes, on each seed's instance, the test-sum loss of the
best such model (each answer token predicted from the answer tokens before it, by their
frequencies over every sum of the task) and refuses a bar that is not below the least of them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict

import numpy as np

from harness.engine.run import trusted_call
from harness.shared_tests.inputs import DATA, learning_instance, set_draw_secret
from harness.shared_tests.laws.training import heldout_loss
from harness.subjects import Kind, Subject
from tasks import addition

SEEDS = (0, 1, 2, 3, 4)
DRAW_SECRET = 0
# The sums fit is not given (validation, test and unused sums): a subject can list every sum it
# was not given, less the CHECKPOINT_ROWS validation sums its checkpoints show, so 2200 leaves
# it 2136 candidates for 200 test sums (10.7x; issue 49: 600 left it 536, 2.7x). fit trains on
# both orders of the other 1895 of the 4095 two-digit sums (about 3720 rows, 6900 before).
# Measured on the new split (draw secret 0): impl's held-out loss over instances 0-9 spread from
# 0.145 to 0.639 (median 0.20; instance 1 the worst), the torch copy's over 0-4 from 0.122 to
# 0.733 (instance 1 again); on the old split impl's had spread 0.205-0.404 (0.23-0.31 for
# instances 0-1 on today's code) and the torch copy's up to 0.76: no wider tail for half the
# data, the hard instances being those that learn the carry late.
HELD_OUT = 2200
DIGITS = 2
# The bar sits 1.9 times above impl's worst (1.21, where 3x the old split's worst had put it):
# 1.66 times the worst correct run measured (the torch copy's 0.733; 1.6 before: 1.21 over
# 0.76), and 1.14 times below the least loss a model blind to the source reaches on these
# instances (blind_losses: 1.378-1.415 over instances 0-9; mutant s04 learns only the answers'
# digit statistics, 1.45 measured before, and a fit that never reads the source would too); far
# below a model that cannot learn (~2.9, s03). 3x would now put it at 1.92, above them all.
MARGIN = 1.9

SETUP = {
    "task": {"digits": DIGITS, "n_test": 200, "held_out": HELD_OUT, "n_train": None, "seed": 0},
    # small enough that 600 updates take a few seconds on one thread; a constant rate of 4e-3
    # learns the task in 600 updates where Noam's warmup and decay (fit's own test) do not
    "config": {
        "src_vocab": 14,
        "tgt_vocab": 14,
        "d_model": 32,
        "n_heads": 4,
        "d_ff": 128,
        "n_enc": 1,
        "n_dec": 1,
        "dropout": 0.0,
        "norm": "post",
        "tie_embeddings": True,
        "max_len": 16,
        "ln_eps": 1e-5,
    },
    "recipe": {"steps": 600, "batch": 64, "warmup": 100, "factor": 1.0, "lr": 4e-3},
    "seeds": list(SEEDS),
}


def blind_loss(task: dict, digits: int) -> float:
    """The test-sum loss (mean cross-entropy per answer token, eos included) of the best model
    blind to the source: each target token predicted from the target tokens before it by their
    frequencies over every sum of the task (the most any such model can learn of them), on the
    instance's test sums read back through its relabelling."""
    ops = addition.operand_range(digits)
    every = np.array([(a, b) for a in ops for b in ops], dtype=np.int64)
    counts: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
    for row in addition.target_array(every, digits).tolist():
        for t in range(1, row.index(addition.EOS) + 1):
            counts[tuple(row[:t])][row[t]] += 1
    total, tokens = 0.0, 0
    for row in np.argsort(task["relabel"])[task["test_tgt"]].tolist():
        for t in range(1, row.index(addition.EOS) + 1):
            seen = counts[tuple(row[:t])]
            total -= math.log(seen[row[t]] / sum(seen.values()))
            tokens += 1
    return total / tokens


def derive() -> dict:
    """Train impl under every seed and return the setup with its losses and bar."""
    losses, blind = [], []
    set_draw_secret(DRAW_SECRET)
    with trusted_call(Subject("impl", Kind.CORRECT, module="impl.transformer")) as call:
        for seed in SEEDS:
            start = time.monotonic()
            losses.append(heldout_loss(call, SETUP, seed).loss)
            blind.append(blind_loss(learning_instance(SETUP, seed), DIGITS))
            print(
                f"seed {seed}: held-out loss {losses[-1]:.4f}, blind to the source "
                f"{blind[-1]:.4f} ({time.monotonic() - start:.1f} s)"
            )
    bar = max(losses) * MARGIN
    if not bar < min(blind):
        raise SystemExit(
            f"bar {bar:.4f} is not below {min(blind):.4f}, the loss a model blind to the source "
            "reaches: a smaller MARGIN, or a task impl learns better"
        )
    return {
        **SETUP,
        "impl_losses": losses,
        "blind_losses": blind,
        "bar": bar,
        "derivation": f"worst of impl's held-out losses over seeds {list(SEEDS)}, each on a "
        f"secret instance of the task (draw secret {DRAW_SECRET}), ({max(losses):.4f}) times "
        f"{MARGIN}, below the {min(blind):.4f} of a model blind to the source; "
        "python -m harness.tools.learning_bar --write",
    }


def stops(n: int) -> None:
    """Where the learning test's run stops for impl and the torch copy, over n instances."""
    setup = json.loads((DATA / "learning_bar.json").read_text())
    set_draw_secret(DRAW_SECRET)
    for module in ("impl.transformer", "impl.torch_copy"):
        updates = []
        with trusted_call(Subject(module, Kind.CORRECT, module=module)) as call:
            for seed in range(n):
                start = time.monotonic()
                loss, k = heldout_loss(call, setup, seed, bar=setup["bar"])
                updates.append(k)
                print(f"{module} instance {seed}: stopped after {k} updates at held-out loss "
                      f"{loss:.4f} ({time.monotonic() - start:.1f} s)", flush=True)  # fmt: skip
        updates.sort()
        print(f"{module}: {updates[0]}-{updates[-1]} updates, median {updates[len(updates) // 2]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write harness/data/learning_bar.json")
    parser.add_argument(
        "--stops", type=int, metavar="N", help="where the test's run stops on N instances"
    )
    args = parser.parse_args(argv)
    if args.stops:
        stops(args.stops)
        return 0
    result = derive()
    print(f"bar {result['bar']:.4f}: {result['derivation']}")
    if args.write:
        (DATA / "learning_bar.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
