"""`xfmr start`: the student's folder generated from the contract, in sync with it; an untouched
stub fails every test it cannot pass with "not implemented: NAME", and each test turns green
as soon as what it needs is written."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.shared_tests.laws import SHARED_TESTS
from harness.students import selfcheck, start

ROOT = Path(__file__).resolve().parents[3]
PYI = ROOT / "impl" / "contract.pyi"


def _defs(tree: ast.Module) -> dict[str, ast.AST]:
    """Every def and class of a module by qualified name (Transformer.encode)."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = node
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    out[f"{node.name}.{member.name}"] = member
    return out


def _signature(node: ast.AST) -> str:
    if isinstance(node, ast.FunctionDef):
        returns = ast.unparse(node.returns) if node.returns else ""
        return f"({ast.unparse(node.args)}) -> {returns}"
    assert isinstance(node, ast.ClassDef)
    fields = [ast.unparse(s) for s in node.body if isinstance(s, ast.AnnAssign)]
    bases = [ast.unparse(b) for b in node.bases]
    decorators = [ast.unparse(d) for d in node.decorator_list]
    return repr((bases, decorators, fields))


def test_the_stub_holds_every_definition_of_the_contract_with_its_signature():
    contract = _defs(ast.parse(PYI.read_text()))
    stub = _defs(ast.parse(start.stub()))
    assert len(contract) >= 15  # the config, the model and its six methods, seven functions
    for name, node in contract.items():
        assert name in stub, f"the stub lacks {name} of impl/contract.pyi"
        assert _signature(stub[name]) == _signature(node), name
    aliases = {
        ast.unparse(n.targets[0])
        for n in ast.parse(PYI.read_text()).body
        if isinstance(n, ast.Assign)
    }
    stub_source = start.stub()
    assert all(f"\n{alias} = " in stub_source for alias in aliases)  # DecodeState


def test_every_stubbed_definition_carries_its_clause_and_raises_its_name():
    clauses = start.clauses()
    stub = _defs(ast.parse(start.stub()))
    for name, node in stub.items():
        doc = ast.get_docstring(node)  # type: ignore[arg-type]
        assert doc, f"{name} has no docstring"
        if not isinstance(node, ast.FunctionDef):
            continue
        [*_, last] = node.body
        assert isinstance(last, ast.Raise) and ast.unparse(last) == (
            f"raise NotImplementedError('{name}')"
        ), name
        if name in clauses:
            assert clauses[name].splitlines()[0] in doc, name
    # the clause is CONTRACT.md's text: noam_rate's formula, translate's pinned beam search
    assert "min(n^-1/2, n * warmup^-3/2)" in ast.get_docstring(stub["noam_rate"])  # type: ignore[arg-type]
    assert "stop the walk when live holds beam_size" in ast.get_docstring(stub["translate"])  # type: ignore[arg-type]


def test_a_contract_change_changes_the_stub():
    pyi = PYI.read_text().replace(
        "def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0)",
        "def noam_rate(step: int, d_model: int, warmup: int, factor: float = 2.0)",
    )
    assert "factor: float = 2.0" in start.stub(pyi)
    with pytest.raises(KeyError):  # a new definition with no clause in CONTRACT.md
        start.stub(pyi + "\ndef beam_width(model: Transformer) -> int: ...\n")


def test_start_writes_the_folder_and_never_overwrites(tmp_path, capsys):
    folder = tmp_path / "mine"
    assert main(["start", str(folder)]) == 0
    out = capsys.readouterr().out
    for name in ("transformer.py", "tests/conftest.py", "tests/test_transformer.py", "README.md"):
        assert (folder / name).is_file(), name
    assert f"your own tests go in {folder / 'tests'}/" in out
    assert f"xfmr check {folder / 'transformer.py'}" in out
    # the README lists the workflow in the seed's order
    readme = (folder / "README.md").read_text()
    order = ["xfmr check transformer.py", "pytest --xfmr", "xfmr milestone", "xfmr diff"]
    assert sorted(order, key=readme.index) == order
    # a second start, or one where any of its files exists: exit 2, nothing touched
    (folder / "transformer.py").write_text("# my work\n")
    (folder / "README.md").unlink()
    assert main(["start", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "never overwrites" in err and "transformer.py" in err
    assert (folder / "transformer.py").read_text() == "# my work\n"
    assert not (folder / "README.md").exists()  # nothing written, not even what was missing
    file = tmp_path / "a_file"
    file.write_text("")
    assert main(["start", str(file)]) == 2


def _paste(stub: Path, name: str) -> None:
    """impl's definition of `name` in place of the stub's."""
    impl = (ROOT / "impl" / "transformer.py").read_text()
    ours = stub.read_text()

    def span(source: str) -> tuple[int, int]:
        [node] = [n for n in ast.parse(source).body if getattr(n, "name", "") == name]
        return node.lineno, node.end_lineno or node.lineno

    a, b = span(ours)
    i, j = span(impl)
    lines, theirs = ours.splitlines(keepends=True), impl.splitlines(keepends=True)
    stub.write_text("".join(lines[: a - 1] + theirs[i - 1 : j] + lines[b:]))


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    folder = tmp_path_factory.mktemp("student")
    assert main(["start", str(folder)]) == 0
    return folder


@pytest.mark.slow
def test_an_untouched_stub_fails_each_test_as_not_implemented(started):
    g = selfcheck.check(started / "transformer.py")
    assert not g.error and not g.rejected, g.error or g.rejected
    failed = [t for t in g.tests if not t.passed]
    # every test, the defaults one too: it reads a config the stub cannot make yet
    assert len(failed) == len(SHARED_TESTS) == 19
    for t in failed:
        assert t.message.startswith("failed: not implemented: "), (t.name, t.message)
        assert "Traceback" not in t.message and "SubjectRaised" not in t.message
    assert not g.diagnosis  # nothing to diagnose in code not yet written


@pytest.mark.slow
def test_implementing_noam_rate_alone_turns_exactly_its_test_green(tmp_path):
    assert main(["start", str(tmp_path)]) == 0
    _paste(tmp_path / "transformer.py", "noam_rate")
    g = selfcheck.check(tmp_path / "transformer.py")
    passed = {t.name for t in g.tests if t.passed}
    assert passed == {"test_hand_example_noam"}


@pytest.mark.slow
def test_pytest_xfmr_on_the_stub_says_not_implemented_and_runs_the_example_tests(started):
    tests = "test_hand_example_noam,test_golden_torch"
    stub = started / "transformer.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--xfmr", str(stub)]
        + ["--xfmr-tests", tests, str(stub), str(started / "tests"), "-q"],
        capture_output=True,
        text=True,
        cwd=started,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: not implemented: noam_rate" in done.stdout
    assert "failed: not implemented: TransformerConfig.__post_init__" in done.stdout
    assert "4 failed" in done.stdout  # two shared tests, the two example tests
    # the example tests pass on the reference: they test the contract, not the stub
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--xfmr"]
        + [str(ROOT / "impl" / "transformer.py"), str(started / "tests"), "-v"],
        capture_output=True,
        text=True,
        cwd=started,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_next_and_the_readme_say_pytest_needs_the_test_extra(tmp_path, capsys):
    assert main(["start", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if x.lstrip().startswith("pytest --xfmr")]
    assert line.endswith("*")  # the footnote: what it needs
    assert "* needs pytest and Hypothesis, xfmr-oracle's [test] extra" in out
    assert out.rstrip().endswith(start.TEST_EXTRA)
    readme = (tmp_path / "README.md").read_text()
    assert "`[test]` extra: `pip install\n   'xfmr-oracle[test]'`" in readme


# A pytest of another environment: xfmr-oracle neither importable nor among its distributions
# (so no pytest11 entry point), as where pytest was installed without the [test] extra
WITHOUT_XFMR = """
import importlib.abc, importlib.metadata, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "harness":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
every = importlib.metadata.distributions
importlib.metadata.distributions = lambda **kw: [
    d for d in every(**kw) if d.metadata["Name"] != "xfmr-oracle"
]
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def _pytest_in(folder: Path, *args: str, without_xfmr: bool = False):
    prefix = ["-c", WITHOUT_XFMR] if without_xfmr else ["-m", "pytest"]
    return subprocess.run(
        [sys.executable, *prefix, "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )


def test_pytest_without_xfmrs_plugin_says_how_to_install_it(tmp_path):
    assert main(["start", str(tmp_path)]) == 0
    # both forms of the README's step 2: the implementation alone, and with the tests folder
    for args in (["--xfmr=transformer.py"], ["--xfmr=transformer.py", "transformer.py", "tests"]):
        done = _pytest_in(tmp_path, *args, without_xfmr=True)
        said = done.stdout + done.stderr
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, said
        assert "unrecognized arguments" not in said
        assert "--xfmr: this pytest has not loaded xfmr-oracle's plugin:" in said
        assert "where xfmr-oracle is not installed" in said
        assert "pip install 'xfmr-oracle[test]'" in said
    # installed, but turned off: said so, with no advice to install
    done = _pytest_in(tmp_path, "-p", "no:xfmr", "--xfmr=transformer.py")
    said = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, said
    assert "it is turned off here (-p no:xfmr)" in said and "pip install" not in said


def test_with_xfmrs_plugin_the_conftest_stays_out_of_the_way(tmp_path):
    assert main(["start", str(tmp_path)]) == 0
    done = _pytest_in(
        tmp_path, "--xfmr=transformer.py", "--xfmr-tests=test_hand_example_noam",
        "transformer.py", "tests", "--collect-only", "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "transformer.py::test_hand_example_noam" in done.stdout
    assert "3 tests collected" in done.stdout
