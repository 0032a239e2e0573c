"""`pytest --xfmr transformer.py`: the self-check as a pytest plugin (the `pytest11` entry point
`xfmr`; inert unless --xfmr is given).

- **The shared tests as pytest items.** The implementation named by --xfmr is collected as a
  file of the shared tests, one item each (`transformer.py::test_golden_torch`), each run and
  judged as `xfmr check` runs and judges it (harness.grading.Grading, the grader's own
  procedure; workers as plain subprocesses, no sandbox), failing with the grader's message and
  diagnosis.
  `pytest --xfmr transformer.py` with no other path runs just those; with paths, name the
  implementation among them to run them too; --xfmr-tests picks some.
- **A student's own suite** gets what the grader's workers give it (as in `xfmr mutation-score`,
  harness.isolation.child.student_suite): the implementation importable as
  `tinyllm.xfmr.transformer` (--xfmr-module changes it), the session fixture `transformer`, and
  the grader's Hypothesis profile (derandomized, no deadline, no database), which wins over a
  conftest's.

Everything here is a self-check of trusted code, not a grade: the header and the summary say so.
Nothing heavy is imported unless --xfmr is given, so the plugin costs the project's own
`pytest` run nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MODULE = "tinyllm.xfmr.transformer"  # the module path a suite imports (as mutation-score's)
# The grader's profile for a student's suite: harness.isolation.child.student_suite registers
# the same one (tests/harness_tests/students/test_selfcheck.py holds them equal)
PROFILE = "xfmr-mutation-score"
PROFILE_SETTINGS: dict[str, Any] = {
    "derandomize": True,
    "deadline": None,
    "database": None,
    "print_blob": False,
}

_ACTIVE = pytest.StashKey["_Active"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("xfmr", "xfmr self-check (your own code, no sandbox, not a grade)")
    group.addoption(
        "--xfmr",
        metavar="IMPL",
        help="your transformer.py (a file, a package, or its folder): collected, it runs the "
        "shared tests as items; your suite gets it as the fixture `transformer` and as the "
        "module tinyllm.xfmr.transformer, under the grader's Hypothesis profile",
    )
    group.addoption(
        "--xfmr-module",
        default=MODULE,
        metavar="NAME",
        help=f"the module path your suite imports the implementation from ({MODULE})",
    )
    group.addoption(
        "--xfmr-tests", metavar="NAMES", help="comma-separated shared tests to collect (all)"
    )


def _anchor(path: Path) -> Path:
    """The file the shared tests are collected from: the implementation's file, a package's
    __init__.py, or the transformer.py in a plain folder (as the grader picks it)."""
    if path.is_dir():
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
        if (path / "transformer.py").is_file():
            return path / "transformer.py"
    return path


def _target(path: Path) -> Path:
    """What is loaded: a file, or a package's folder."""
    if path.is_dir() and not (path / "__init__.py").is_file():
        return path / "transformer.py"
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """`pytest --xfmr transformer.py` alone: collect the implementation itself (its shared
    tests), not the project's testpaths or the current folder."""
    known = early_config.known_args_namespace
    impl = getattr(known, "xfmr", None)
    if impl and not known.file_or_dir:
        anchor = str(_anchor(Path(impl)))
        args.append(anchor)
        known.file_or_dir = [anchor]


class _Active:
    """The plugin's state in a run with --xfmr."""

    def __init__(self, config: pytest.Config) -> None:
        given = Path(config.option.xfmr)
        if not given.exists():
            raise pytest.UsageError(f"--xfmr: {given} does not exist")
        self.given = given
        self.target = _target(given).resolve()
        self.anchor = _anchor(given).resolve()
        if self.anchor.is_dir() or not self.target.exists():
            raise pytest.UsageError(
                f"--xfmr: {given} is neither a .py file, nor a package, nor a folder holding "
                "transformer.py"
            )
        self.module = config.option.xfmr_module
        self.names = [n for n in (config.option.xfmr_tests or "").split(",") if n]
        self.runner: Any = None  # harness.grading.Grading, made at the first shared item
        # a failure's first line -> the first shared test that failed so: the others say so
        # instead of repeating it (a submission that does not load fails every test alike)
        self.first_with: dict[str, str] = {}
        # a student's folder (transformer.py and its helpers): the module path's parent package
        # is that folder, so its relative imports resolve, and the folder is on sys.path
        here = given.resolve()
        folder = here if here.is_dir() and self.target.parent == here else None
        self.folder = folder or self.target.parent
        self.finders = [_Subject(self.module, self.target), _Parents(self.module, folder)]

    def tests(self) -> list[Any]:
        from harness.shared_tests.laws import SHARED_TESTS

        unknown = sorted(set(self.names) - {t.name for t in SHARED_TESTS})
        if unknown:
            known = [t.name for t in SHARED_TESTS]
            raise pytest.UsageError(f"--xfmr-tests: unknown {unknown}; known: {known}")
        return [t for t in SHARED_TESTS if not self.names or t.name in self.names]

    def run(self, test: Any) -> Any:
        if self.runner is None:
            from harness.students.selfcheck import runner

            self.runner = runner(self.given, self.tests())
        return self.runner.result(test)


class _Subject(importlib.abc.MetaPathFinder):
    """Finds the implementation under the suite's module path (first on sys.meta_path, so it
    wins over an installed package of that name)."""

    def __init__(self, name: str, target: Path) -> None:
        self.name, self.target = name, target

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if fullname != self.name:
            return None
        if self.target.is_dir():
            return importlib.util.spec_from_file_location(
                fullname, self.target / "__init__.py", submodule_search_locations=[str(self.target)]
            )
        return importlib.util.spec_from_file_location(fullname, self.target)


class _Parents(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty parent packages of the module path (tinyllm, tinyllm.xfmr), last on sys.meta_path:
    only where no real package of that name is found."""

    def __init__(self, name: str, folder: Path | None = None) -> None:
        parts = name.split(".")
        self.parents = {".".join(parts[:i]) for i in range(1, len(parts))}
        self.direct = ".".join(parts[:-1])  # the implementation's own package
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001
        if fullname not in self.parents:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, is_package=True)
        if spec is not None and fullname == self.direct and self.folder is not None:
            spec.submodule_search_locations = [str(self.folder)]
        return spec

    def create_module(self, spec):  # noqa: ANN001
        return None

    def exec_module(self, module) -> None:  # noqa: ANN001
        pass


def _fixtures(module: str) -> ModuleType:
    """A plugin holding the fixture the grader's workers give a student's suite."""

    @pytest.fixture(name="transformer", scope="session")
    def transformer() -> ModuleType:
        return importlib.import_module(module)

    plugin = ModuleType("xfmr_fixtures")
    plugin.transformer = transformer  # type: ignore[attr-defined]
    return plugin


def _load_profile() -> None:
    try:
        import hypothesis
    except ImportError:  # a suite without Hypothesis needs no profile
        return
    hypothesis.settings.register_profile(PROFILE, **PROFILE_SETTINGS)
    hypothesis.settings.load_profile(PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    if not getattr(config.option, "xfmr", None):
        return
    active = _Active(config)
    config.stash[_ACTIVE] = active
    sys.meta_path.insert(0, active.finders[0])
    sys.meta_path.append(active.finders[1])
    if str(active.folder) not in sys.path:  # its own helper modules import (last: never first)
        sys.path.append(str(active.folder))
    config.pluginmanager.register(_fixtures(active.module), "xfmr-fixtures")
    _load_profile()


def pytest_unconfigure(config: pytest.Config) -> None:
    active = config.stash.get(_ACTIVE, None)
    if active is None:
        return
    if active.runner is not None:
        active.runner.close()
    for finder in active.finders:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that fails to import, a half-made module
        return False


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    active = config.stash.get(_ACTIVE, None)
    if active is None:
        return None
    lines = [
        f"xfmr: self-check of {active.given} (your own code in plain subprocesses, no sandbox; "
        "not a grade)",
        f"xfmr: your suite imports it as {active.module} or takes the fixture `transformer`",
    ]
    if not _installed("hypothesis"):
        from harness.students.start import TEST_EXTRA

        lines.append(
            "xfmr: Hypothesis is not installed here (the grader runs your suite with it): "
            f"the [test] extra installs it, {TEST_EXTRA}"
        )
    return lines


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config) -> None:
    if config.stash.get(_ACTIVE, None) is not None:
        _load_profile()  # a conftest may have loaded its own profile: the grader's wins


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    """The implementation's file is the shared tests on it, and nothing else: not also a test
    module that pytest would import here (a path given on the command line is collected
    whatever its name)."""
    collected = yield
    active = parent.config.stash.get(_ACTIVE, None)
    if active is not None and file_path.resolve() == active.anchor:
        return [SharedTests.from_parent(parent, path=file_path)]
    return collected


class SharedTests(pytest.File):
    """The implementation's file, as the shared tests on it."""

    def collect(self):  # noqa: ANN201
        for test in self.config.stash[_ACTIVE].tests():
            yield SharedTest.from_parent(self, name=test.name, test=test)


class SharedTestFailed(Exception):
    """A shared test failed; the message is the grader's."""


class SharedTest(pytest.Item):
    """One shared test on the implementation."""

    def __init__(self, *, test: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.test = test
        self.user_properties.append(("law", test.law))

    def runtest(self) -> None:
        from harness.outcomes import Outcome

        result = self.config.stash[_ACTIVE].run(self.test)
        self.user_properties.append(("score", f"{result.score:g}/{result.max_score:g}"))
        if result.passed:
            return
        if result.outcome is Outcome.NOT_APPLICABLE:
            pytest.skip(result.message)
        raise SharedTestFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # noqa: ANN001
        if isinstance(excinfo.value, SharedTestFailed):
            message = str(excinfo.value)
            first = (message.splitlines() or [""])[0]
            owner = self.config.stash[_ACTIVE].first_with.setdefault(first, self.name)
            if owner != self.name:  # its own further lines, but none saying the error again
                error = first.removeprefix("failed: ")
                rest = [line for line in message.splitlines()[1:] if error not in line]
                return "\n".join([f"the same error as {owner} (its message is there)", *rest])
            return f"{message}\n(the law of {self.test.name}: {self.test.law})"
        return str(super().repr_failure(excinfo, style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"xfmr shared test {self.name}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    active = config.stash.get(_ACTIVE, None)
    if active is None or active.runner is None or not active.runner.results:
        return
    results = list(active.runner.results.values())
    score = sum(r.score for r in results)
    most = sum(r.max_score for r in results)
    passed = sum(r.passed for r in results)
    terminalreporter.write_sep("-", "xfmr self-check (not a grade)")
    terminalreporter.write_line(
        f"Score: {score:g}/{most:g} ({passed}/{len(results)} shared tests passed); your own code "
        "in plain subprocesses, no sandbox: the course grades your submitted file in its sandbox"
    )
