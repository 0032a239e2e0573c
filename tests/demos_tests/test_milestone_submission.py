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


def _impl_as_a_student_file(folder: Path, change: tuple[str, str] | None = None) -> Path:
    """impl/transformer.py copied in as a student's transformer.py (it imports nothing of the
    project, so the copy runs as the student's own file), with one change where given."""
    text = (ROOT / "impl" / "transformer.py").read_text()
    project = ("oracle", "impl", "mutants", "harness", "tasks", "demos")
    assert not [
        line
        for line in text.splitlines()
        if line.startswith(("import ", "from ")) and line.split()[1].split(".")[0] in project
    ]
    if change is not None:
        assert text.count(change[0]) == 1
        text = text.replace(*change)
    mine = folder / "transformer.py"
    folder.mkdir(parents=True, exist_ok=True)
    mine.write_text(text)
    return mine


# The seeds at which the smoke's old recipe (500 updates) failed impl itself (issue 48: 0.374 at
# the default seed, 0.788 at 3, 0.216 at 7); results/demos/smoke_sweep.md has the sweep of every
# seed.
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 3, 7])
def test_smoke_meets_the_bar_with_impl_as_a_student_file(tmp_path, seed):
    mine = _impl_as_a_student_file(tmp_path / "me")
    code, record, _ = _run(tmp_path, mine, "--smoke", "--first-seed", str(seed))
    assert code == 0, record["why"]
    run = record["run"]
    assert run["stopped"] == "solved" and run["updates"] < own_model.SMOKE_UPDATES
    assert run["greedy"] >= own_model.SMOKE_BAR and run["changed_by_padding"] == 0.0


@pytest.mark.slow
def test_smoke_fails_a_translate_that_keeps_eos_and_says_where_to_look(tmp_path):
    # trains like impl (the validation sums are solved under teacher forcing), answers wrong
    keep_eos = (
        "return list(best[:-1]) if best[-1] == eos else list(best)",
        "return list(best)",
    )
    mine = _impl_as_a_student_file(tmp_path / "me", keep_eos)
    code, record, _ = _run(tmp_path, mine, "--smoke")
    assert code == 1 and record["run"]["greedy"] == 0.0
    why = "\n".join(record["why"])
    assert "FAILED: exact match 0.000" in why and "look at translate" in why
    assert "the real bar is the milestone without --smoke" in why


def test_a_fit_that_never_moves_the_weights_is_told_so(tmp_path):
    # zero_grad after backward: every update is a no-op, the loss stays at its first value
    late = (
        "                optimizer.zero_grad(set_to_none=True)\n                loss.backward()\n",
        "                loss.backward()\n                optimizer.zero_grad(set_to_none=True)\n",
    )
    module = own_model.load(_impl_as_a_student_file(tmp_path / "me", late))
    s = own_model.settings(True)["train"] | {"steps": 60, "n_test": 50, "n_val": 50}
    run = own_model.train_and_evaluate(module, s, seed=0)
    assert run["stopped"] == "steps" and run["updates"] == 60
    demo = {
        "summary": {"post-LN, constant rate": {"mean": 0.9}, "pre-LN, constant rate": {"mean": 0.5}}
    }
    met, why = own_model.judge(run, demo, own_model.SMOKE_BAR, "", smoke=True)
    assert not met and why[0].startswith("FAILED: exact match")
    assert "flat" in why[1] and "the model did not learn" in why[1]
    assert "zero_grad, backward, step in that order" in why[2]
    assert not any("--first-seed" in line for line in why)  # no seed cures a broken fit


def test_a_missed_bar_on_a_loss_that_still_falls_suggests_another_seed():
    falling = [5.0] * 5 + [2.0 - i / 1000 for i in range(995)]
    run = {"greedy": 0.5, "greedy_padded": 0.5, "changed_by_padding": 0.0, "seed": 4}
    run |= {"losses": falling, "updates": 1000, "validation_solved": False}
    demo = {
        "summary": {"post-LN, constant rate": {"mean": 0.9}, "pre-LN, constant rate": {"mean": 0.5}}
    }
    met, why = own_model.judge(run, demo, own_model.SMOKE_BAR, "", smoke=True)
    assert not met
    assert "still falling at the last update" in why[1]
    assert "--first-seed 5" in why[2] and own_model.SWEEP in why[2]
    _, full = own_model.judge(run, demo, own_model.TARGET, "")  # the full milestone: no smoke line
    assert "--first-seed 5" in full[2] and not any("without --smoke" in w for w in full)


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
