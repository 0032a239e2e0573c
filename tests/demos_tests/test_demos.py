"""The demo commands: a tiny end-to-end run (train, evaluate, translate) and their argument errors.

The long runs (the milestone, the LayerNorm demo) are commands, not tests: results/ holds them.
"""

import json

import pytest
import torch

from harness.cli import main

# d_model 16, one layer each side: the whole file runs in seconds on a loaded 2-core machine
TINY = ["--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--dropout", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    argv = ["train", "--out", str(out), "--digits", "2", "--steps", "50", "--batch", "32"]
    argv += ["--lr", "3e-3", "--n-test", "40", "--seed", "1", *TINY]
    assert main(argv) == 0
    return out


def test_train_writes_model_metrics_and_png_and_lowers_the_loss(trained):
    assert {"config.json", "model.safetensors", "metrics.json", "loss.png"} <= {
        p.name for p in trained.iterdir()
    }
    metrics = json.loads((trained / "metrics.json").read_text())
    losses = metrics["losses"]
    assert len(losses) == 50
    # 50 updates at a constant 3e-3 take the loss from ~2.8 (uniform over 14 ids) to ~2.0; the
    # bar of a 15% drop, first ten against last ten updates, leaves room for the seed's noise
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.85 * first, f"loss did not fall: first ten {first:.3f}, last ten {last:.3f}"
    assert 0 <= metrics["exact_match"]["greedy"] <= 1
    assert metrics["task"] == {
        "name": "reversed-addition",
        "digits": 2,
        "n_test": 40,
        "n_train": None,
        "split_seed": 1,
        "train_pairs": 8100 - sum(2 - (a == b) for a, b in _held_out(2, 40, 1)),
    }


def _held_out(digits, n_test, seed):
    from tasks.addition import split_sums

    return split_sums(digits, n_test, seed=seed)[1].tolist()


def test_evaluate_reports_greedy_and_beam(trained, capsys):
    assert main(["evaluate", str(trained), "--beam", "3"]) == 0
    printed = capsys.readouterr().out
    assert "greedy: exact match" in printed and "beam3: exact match" in printed
    em = json.loads((trained / "metrics.json").read_text())["exact_match"]
    assert em["n"] == 40 and 0 <= em["greedy"] <= 1 and 0 <= em["beam3"] <= 1


def test_translate_prints_the_answer_and_the_beams_scores(trained, capsys):
    assert main(["translate", str(trained), "12+34", "--beam", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("12+34 = ")
    scores = [float(line.split()[0]) for line in lines[2:]]
    assert scores and scores == sorted(scores, reverse=True)  # best first
    assert sum("<- translate's answer" in line for line in lines[2:]) == 1


def test_beam_hypotheses_winner_is_translates_answer(trained):
    # law: the oracle's pinned search (which the demo prints) and impl's translate pick the same
    # winner on the same saved weights
    from demos.train import beam_hypotheses
    from impl.transformer import load_transformer, translate
    from tasks import addition

    model = load_transformer(trained)
    src = addition.encode_sources(_held_out(2, 40, 1)[:10], 2)
    answers = translate(model, src, addition.BOS, addition.EOS, addition.PAD, 4, beam_size=3)
    for row, answer in zip(src, answers, strict=True):
        assert beam_hypotheses(str(trained), row, 3, 4, 1.0)[0][0] == answer


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train"], "the following arguments are required: --out"),
        (["train", "--out", "x", "--norm", "mid"], "invalid choice: 'mid'"),
        (["train", "--out", "x", "--steps", "0"], "expected a positive integer, got '0'"),
        (["train", "--out", "x", "--lr", "-1"], "expected a positive number, got '-1'"),
        (["train", "--out", "x", "--smoothing", "1.5"], "expected a number in [0, 1), got '1.5'"),
        (["train", "--out", "x", "--device", "tpu"], "got 'tpu'"),
        (["evaluate"], "the following arguments are required: dir"),
        (["translate", "nowhere", "1+2"], "'nowhere' is not a folder written by `xfmr train`"),
        (["ln-demo", "--seeds", "0"], "expected a positive integer, got '0'"),
        (["ln-demo", "--d-model", "ten"], "expected a positive integer, got 'ten'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--out", "x", "--device", "cuda"])
    assert "no usable CUDA" in capsys.readouterr().err


def test_translate_refuses_a_sum_of_the_wrong_width(trained, capsys):
    assert main(["translate", str(trained), "123+45"]) == 2
    assert "operand '123' in '123+45' is not a 2-digit number" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "ln-demo"])
def test_heads_must_divide_the_width(command, tmp_path, capsys):
    assert main([command, "--out", str(tmp_path), "--steps", "1", *TINY, "--heads", "3"]) == 2
    assert "--d-model 16 is not divisible by --heads 3" in capsys.readouterr().err


def test_ln_demo_refuses_a_tail_longer_than_the_run(capsys):
    assert main(["ln-demo", "--steps", "5", "--tail", "10"]) == 2
    assert "--tail 10 exceeds --steps 5" in capsys.readouterr().err
