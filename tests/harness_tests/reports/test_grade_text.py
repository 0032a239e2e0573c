"""A grade's text at a glance (issue 48): a failed verdict marked FAIL (KILLED is the matrix's
word), one entry per distinct error naming the tests it affected (a submission that does not
load: its error once, not 19 times), and a long message cut with a pointer to the rest."""

from __future__ import annotations

from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import grade as grade_report
from harness.shared_tests.laws import SHARED_TESTS

LOAD = (
    "failed: load: the subject raised ModuleNotFoundError: No module named 'notamodule_xyz' at "
    "/tmp/me/transformer.py:26 in <module>"
)
GOLDEN = "test_golden_torch"


def grade(messages: dict[str, str]) -> Grade:
    """A grade where the tests named in `messages` failed with those messages."""
    return Grade(
        "transformer.py",
        [
            TestResult(
                t.name,
                t.law,
                Outcome.KILLED if t.name in messages else Outcome.PASSED,
                0.0 if t.name in messages else float(t.points),
                float(t.points),
                messages.get(t.name, ""),
                0.1,
            )
            for t in SHARED_TESTS
        ],
    )


def why(g: Grade) -> list[str]:
    lines = grade_report.text(g).splitlines()
    return lines[lines.index("Why:") + 1 : lines.index("", lines.index("Why:"))]


def test_an_error_every_test_shares_is_said_once():
    # as a submission importing a module that is not installed fails: every test alike, the
    # golden test's diagnosis saying it again, the others pointing to the golden test
    messages = {t.name: LOAD for t in SHARED_TESTS}
    messages[GOLDEN] = f"{LOAD}\nforward pass: no diagnosis: SubjectRaised: {LOAD[8:]}"
    messages["test_decoder_is_causal"] = f"{LOAD}\n(the forward pass's diagnosis is under {GOLDEN})"
    g = grade(messages)
    text = grade_report.text(g)
    assert text.count("ModuleNotFoundError") == 1, text
    assert why(g) == [f"  every test ({len(SHARED_TESTS)}):", f"    {LOAD}"]
    marks = [line.split()[0] for line in text.splitlines() if line.startswith("  ")][:19]
    assert set(marks) == {"FAIL"} and "KILLED" not in text


def test_a_shared_error_names_its_tests_and_single_ones_keep_their_law():
    stub = "failed: not implemented: TransformerConfig.__post_init__"
    first, second, *rest = [t.name for t in SHARED_TESTS]
    messages = {name: stub for name in rest}
    messages[first] = "failed: not implemented: label_smoothed_loss"
    messages[second] = "failed: not implemented: noam_rate"
    said = why(grade(messages))
    assert said[0] == f"  {first} ({SHARED_TESTS[0].law})"
    assert said[1] == "    failed: not implemented: label_smoothed_loss"
    assert said[4:] == [
        f"  {len(rest)} of {len(SHARED_TESTS)} tests, all but {first}, {second}:",
        f"    {stub}",
    ]
    # a few tests alike: named
    few = {name: stub for name in rest[:3]}
    assert why(grade(few))[0] == f"  3 tests: {', '.join(rest[:3])}:"
    # lines that differ between them are kept, each once
    few[rest[0]] = f"{stub}\nforward pass: first divergence at encoder.0.norm1"
    assert why(grade(few))[1:] == [
        f"    {stub}",
        "    forward pass: first divergence at encoder.0.norm1",
    ]


def test_a_long_message_says_how_much_more_the_json_holds():
    long = "\n".join(f"line {i}" for i in range(11))
    said = why(grade({GOLDEN: long}))
    assert said[1:9] == [f"    line {i}" for i in range(8)]
    assert said[9] == "    (3 more lines in the JSON report: --json FILE)"
    assert grade_report.to_json(grade({GOLDEN: long}))["tests"][2]["message"] == long
