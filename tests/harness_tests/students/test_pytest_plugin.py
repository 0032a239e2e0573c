"""`pytest --xfmr`'s plugin where what it needs is missing: a hint that names the [test] extra,
never a bare import error (the plugin's own items and fixtures: test_selfcheck.py)."""

import subprocess
import sys

from harness.cli import main
from harness.students.start import TEST_EXTRA

# Hypothesis as if not installed: its import fails, find_spec says None, no pytest11 entry point
WITHOUT_HYPOTHESIS = """
import importlib.metadata, sys

sys.modules["hypothesis"] = None
every = importlib.metadata.distributions
importlib.metadata.distributions = lambda **kw: [
    d for d in every(**kw) if d.metadata["Name"] != "hypothesis"
]
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def _collect(folder, script=None):
    prefix = ["-c", script] if script else ["-m", "pytest"]
    return subprocess.run(
        [sys.executable, *prefix, "-p", "no:cacheprovider", "--xfmr=transformer.py"]
        + ["--xfmr-tests=test_hand_example_noam", "transformer.py", "tests", "--collect-only"],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )


def test_without_hypothesis_the_header_says_to_install_the_test_extra(tmp_path):
    assert main(["start", str(tmp_path)]) == 0
    done = _collect(tmp_path, WITHOUT_HYPOTHESIS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "xfmr: Hypothesis is not installed here (the grader runs your suite with it)" in (
        done.stdout
    )
    assert TEST_EXTRA in done.stdout
    # with Hypothesis, no such line
    done = _collect(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "xfmr: self-check of transformer.py" in done.stdout
    assert "Hypothesis is not installed" not in done.stdout


def test_an_error_every_shared_test_shares_is_printed_once(tmp_path):
    # a submission importing a module that is not installed: every shared test fails alike;
    # the first says the error, the others point to it
    (tmp_path / "transformer.py").write_text("import notamodule_xyz\n")
    (tmp_path / "tests").mkdir()
    names = "test_hand_example_noam,test_golden_torch,test_validation"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--xfmr=transformer.py"]
        + [f"--xfmr-tests={names}", "-rN"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("No module named 'notamodule_xyz'") == 1, done.stdout
    assert done.stdout.count("the same error as test_hand_example_noam (its message is there)") == 2
    assert "3 failed" in done.stdout
