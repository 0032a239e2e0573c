"""`xfmr milestone --submission`: MS-L5 on a student's own model (its fit, translate, noam_rate,
optimizer), with a clear verdict and reason."""

import json
from pathlib import Path

import pytest

from demos import own_model
from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
CORRECT = ROOT / "examples" / "correct_submission.py"


def _run(tmp_path: Path, submission: Path, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "results"
    argv = ["milestone", "--submission", str(submission), "--results", str(out), *extra]
    code = main(argv)
    return (
        code,
        json.loads((out / "milestone.json").read_text()),
        (out / "milestone.md").read_text(),
    )


def test_a_stub_fails_with_the_name_of_what_is_not_written(tmp_path, capsys):
    assert main(["start", str(tmp_path / "me")]) == 0
    code, record, report = _run(tmp_path, tmp_path / "me" / "transformer.py", "--smoke")
    assert code == 1 and not record["met"]
    assert "not implemented: TransformerConfig.__post_init__" in record["why"][0]
    assert "**NOT met**" in report and "not implemented" in report
    assert "NOT met" in capsys.readouterr().out


def test_a_module_without_the_contracts_names_fails_naming_them(tmp_path):
    mine = tmp_path / "transformer.py"
    mine.write_text("def noam_rate(step, d_model, warmup, factor=1.0):\n    return 0.0\n")
    code, record, _ = _run(tmp_path, mine, "--smoke")
    assert code == 1
    assert "lacks TransformerConfig, Transformer, label_smoothed_loss" in record["why"][0]


def test_the_verdict_names_each_failing_part():
    demo = {
        "summary": {"post-LN, constant rate": {"mean": 0.9}, "pre-LN, constant rate": {"mean": 0.5}}
    }
    run = {"greedy": 0.99, "greedy_padded": 0.2, "changed_by_padding": 0.5}
    met, why = own_model.judge(run, demo, 0.98, "")
    assert not met
    assert any(line.startswith("FAILED: 3 pad positions") and "are read" in line for line in why)
    assert any(line.startswith("ok: without warmup post-LN keeps 90%") for line in why)
    flat = {
        "summary": {"post-LN, constant rate": {"mean": 0.5}, "pre-LN, constant rate": {"mean": 0.6}}
    }
    met, why = own_model.judge(
        {"greedy": 1.0, "greedy_padded": 1.0, "changed_by_padding": 0.0}, flat, 0.98, ""
    )
    assert not met and why[-1].startswith("FAILED: without warmup")


@pytest.mark.slow
def test_smoke_on_the_faulty_example_fails_naming_the_padding(tmp_path):
    code, record, _ = _run(tmp_path, ROOT / "examples" / "faulty_submission.py", "--smoke")
    assert code == 1
    assert record["run"]["changed_by_padding"] > own_model.PADDING_CHANGES
    assert any("padded source positions are read" in line for line in record["why"])


def test_smoke_needs_a_submission(capsys):
    assert main(["milestone", "--smoke"]) == 2
    assert "--smoke needs --submission" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_on_the_correct_example_meets_the_bar(tmp_path):
    code, record, report = _run(tmp_path, CORRECT, "--smoke")
    assert code == 0, record["why"]
    assert record["run"]["greedy"] >= own_model.SMOKE_BAR
    assert record["run"]["changed_by_padding"] <= own_model.PADDING_CHANGES
    summary = record["ln_demo"]["summary"]
    # the LayerNorm demo on the student's model: post-LN stalls without warmup, pre-LN trains
    assert summary["pre-LN, constant rate"]["mean"] < summary["post-LN, constant rate"]["mean"]
    assert "## Answers" in report and "| post-LN, 2 digits |" in report
    assert (tmp_path / "results" / "milestone_loss.png").is_file()
