"""The table of results/grading/defaults_steering.md: each steering overlay (and the correct
submission) under the defaults law and the laws that call the same functions, over draws, each
check on a fresh subject, in this process (trusted code).

    python tests/harness_tests/shared_tests/steering_table.py [--root CHECKOUT] [--draws 0-19]

--root runs another checkout's laws and probes (the tree before a change: `git archive`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUBJECTS = (
    "correct",
    "steer_defaults_history",
    "steer_defaults_stack",
    "steer_defaults_count",
    "steer_defaults_frame",
)
LAWS = (
    "test_defaults_are_the_contracts",
    "test_hand_example_noam",
    "test_fit_follows_the_schedule_and_is_reproducible",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3])
    p.add_argument("--draws", default="0-19")
    args = p.parse_args()
    sys.path.insert(0, str(args.root))
    from harness.isolation.child import probes
    from harness.isolation.child.load import from_source
    from harness.shared_tests import inputs
    from harness.shared_tests.laws import BY_NAME
    from harness.shared_tests.record import Failure

    # the overlays are this checkout's (an older root may not have them all)
    here = Path(__file__).resolve().parents[3]
    correct = (args.root / "examples" / "correct_submission.py").read_text()
    hostile = here / "tests" / "harness_tests" / "isolation" / "hostile"
    lo, _, hi = args.draws.partition("-")
    failed = {(s, law): 0 for s in SUBJECTS for law in LAWS}
    first: dict[tuple[str, str], str] = {}
    for i, draw in enumerate(range(int(lo), int(hi or lo) + 1)):
        inputs.set_draw_secret(draw)
        for s in SUBJECTS:
            extra = "" if s == "correct" else "\n\n" + (hostile / f"{s}.py").read_text()
            for law in LAWS:
                module = from_source(correct + extra, f"<{s}>", name=f"xfmr_table_{s}_{law}_{i}")
                try:
                    BY_NAME[law].check(lambda probe, m=module, **kw: probes.PROBES[probe](m, **kw))
                except Failure as e:
                    failed[(s, law)] += 1
                    first.setdefault((s, law), str(e))
    n = int(hi or lo) - int(lo) + 1
    print("| submission | " + " | ".join(LAWS) + " |")
    print("| --- |" + " --- |" * len(LAWS))
    for s in SUBJECTS:
        print(f"| {s} | " + " | ".join(f"{failed[(s, law)]}/{n}" for law in LAWS) + " |")
    for (s, law), said in first.items():
        print(f"\n{s}, {law}: {said[:300]}")


if __name__ == "__main__":
    main()
