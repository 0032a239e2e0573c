"""test_validation's message (issue 48): a headline, then one line per thing that happened with
its cases under it, every line short; a NotImplementedError raised inside torch (a module
whose forward is misspelt) told from the subject's own `raise NotImplementedError`."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.isolation.child import probes
from harness.isolation.child.load import from_path
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.laws.interface import happened, wrong_cases
from harness.shared_tests.record import Failure

ROOT = Path(__file__).resolve().parents[3]
CORRECT = ROOT / "examples" / "correct_submission.py"
STEPPER = (
    "class Stepper(nn.Module):\n"
    "    def foward(self, y_prev, memory, state):  # misspelt: nn.Module's own forward raises\n"
    "        return y_prev\n\n\n"
)


def half_written(tmp_path: Path):
    """The correct example whose decode_step calls a module without forward, and whose fit is
    not written yet (the stub's raise)."""
    source = CORRECT.read_text()
    lines = source.splitlines(keepends=True)
    edits = []  # (first line, last line, new lines), 1-based
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "Transformer":
            edits.append((node.lineno, node.lineno - 1, [STEPPER]))
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name == "__init__":
                    edits.append(
                        (m.end_lineno + 1, m.end_lineno, ["        self.step = Stepper()\n"])
                    )
                if isinstance(m, ast.FunctionDef) and m.name == "decode_step":
                    body = ["        return self.step(y_prev, memory, state)\n"]
                    edits.append((m.body[0].lineno, m.end_lineno, body))
        if isinstance(node, ast.FunctionDef) and node.name == "fit":
            body = ['    raise NotImplementedError("fit")\n']
            edits.append((node.body[0].lineno, node.end_lineno, body))
    for first, last, new in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[first - 1 : last] = new
    path = tmp_path / "transformer.py"
    path.write_text("".join(lines))
    return from_path(path, name="xfmr_half_written")


def verdict(module) -> str | None:
    try:
        BY_NAME["test_validation"].check(lambda probe, **kw: probes.PROBES[probe](module, **kw))
    except Failure as e:
        return str(e)
    return None


def test_a_notimplementederror_inside_torch_is_told_from_the_subjects_own(tmp_path):
    message = verdict(half_written(tmp_path))
    assert message is not None
    lines = message.splitlines()
    assert lines[0] == (
        "7 of 28 cases wrong: bad input must raise the contract's error class, good input nothing"
    )
    assert all(len(line) <= 100 for line in lines), message
    assert all(line.startswith("  ") for line in lines[1:]), message  # details under it
    joined = " ".join(line.strip() for line in lines)
    # torch's: where it was raised, and the subject's line that called it
    assert (
        'raised NotImplementedError(\'Module [Stepper] is missing the required "forward" '
        "function') inside torch at torch/nn/modules/module.py:"
    ) in joined, message
    assert "_forward_unimplemented, called from your transformer.py:" in joined, message
    assert "in decode_step: expected ValueError: decode_step: y_prev of another batch size;" in (
        joined
    )
    assert "expected no error: accepted: decode_step at positions 0 .. max_len - 1" in joined
    # the subject's own raise: at its own line, nothing of torch
    assert "raised NotImplementedError('fit') at your transformer.py:" in joined, message
    assert joined.endswith("in fit: expected ValueError: fit: src and tgt rows differ"), message


def test_the_correct_example_passes(tmp_path):
    path = tmp_path / "transformer.py"
    path.write_text(CORRECT.read_text())
    assert verdict(from_path(path, name="xfmr_correct_example")) is None


def test_cases_are_grouped_by_what_happened():
    raised = {"type": "RuntimeError", "bases": ["RuntimeError"], "at": "functional.py:9 in f"}
    raised |= {"yours": False, "library": "torch", "from": "transformer.py:88 in forward"}
    wrong = [
        ("src_mask not bool", "TypeError", None),
        ("tgt_mask not bool", "TypeError", None),
        ("batch sizes differ", "ValueError", None),
        ("decode: src_mask not bool", "TypeError", raised),
    ]
    assert wrong_cases(wrong, 28).splitlines() == [
        "4 of 28 cases wrong: bad input must raise the contract's error class, good input nothing",
        "  nothing raised:",
        "    expected TypeError: src_mask not bool; tgt_mask not bool",
        "    expected ValueError: batch sizes differ",
        "  raised RuntimeError inside torch at functional.py:9 in f, called from your "
        "transformer.py:88 in",
        "      forward:",
        "    expected TypeError: decode: src_mask not bool",
    ]
    # a reply without frames (no origin found): the class alone, nothing claimed
    assert happened({"type": "ValueError", "bases": [], "at": ""}) == "raised ValueError"
