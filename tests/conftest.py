"""Suite-wide settings and fixtures."""

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

# Every model in the suite is tiny: a second intra-op thread only spin-waits on such matrices,
# and on a loaded 2-core machine it made whole test files 4-10x slower (measured).
torch.set_num_threads(1)

# Under pytest-xdist every worker grades beside the others: a grade may take its worker's share
# of the cores (harness.grading.grader_cpus), one on CI's 2 cores and 2 workers, where a second
# worker per grade only cost CPU (the apart path keeps its own tests: test_engine_exec, test_grade).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = (os.cpu_count() or 1) // max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("XFMR_GRADER_CPUS", str(max(1, _share)))

# The grader proves its workers on a correct model once per environment and keeps the pass
# (harness.canary): in a folder of this test process's, never a user's cache of another state.
os.environ.setdefault("XFMR_CANARY_CACHE", tempfile.mkdtemp(prefix="xfmr-canary-tests-"))
# a self-check's bounds and next draws (harness.students.draws_ahead): a folder of the run's
# own, and no detached preparation after each `xfmr check` a test runs (test_draws_ahead's own)
os.environ.setdefault("XFMR_CHECK_CACHE", tempfile.mkdtemp(prefix="xfmr-check-tests-"))
os.environ.setdefault("XFMR_CHECK_AHEAD", "0")


# Stryker's official report schema, as published on npm (mutation-testing-report-schema); .ci/run
# fetches it with `npm pack` into .schemas/ (ignored by git). Tests validate every Stryker report
# against it with jsonschema; CI must never skip them.
SCHEMAS = Path(__file__).resolve().parents[1] / ".schemas"
STRYKER_SCHEMA = SCHEMAS / "mutation-testing-report-schema.json"


@pytest.fixture(scope="session")
def stryker_schema():
    """A jsonschema validator of the official schema (skipped, outside CI, where not fetched)."""
    jsonschema = pytest.importorskip("jsonschema")
    if not STRYKER_SCHEMA.exists():
        fetch = "npm pack mutation-testing-report-schema@3.8.4 (see .ci/run)"
        if os.environ.get("CI"):
            pytest.fail(f"{STRYKER_SCHEMA} is missing: CI must fetch it ({fetch})")
        pytest.skip(f"the official Stryker schema is not fetched here: {fetch}")
    schema = json.loads(STRYKER_SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="session")
def junit_schema():
    """Jenkins' JUnit schema (junit-10.xsd, from pytest's source distribution), as an xmlschema
    validator (skipped, outside CI, where not fetched)."""
    xmlschema = pytest.importorskip("xmlschema")
    path = SCHEMAS / "junit-10.xsd"
    if not path.exists():
        fetch = "pip download --no-binary :all: pytest==9.2.0 (see .ci/run)"
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: CI must fetch it ({fetch})")
        pytest.skip(f"Jenkins' JUnit schema is not fetched here: {fetch}")
    return xmlschema.XMLSchema(str(path))


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium, which reads the project's HTML pages back (.ci/run installs it); its
    absence fails CI and skips elsewhere."""
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is absent: Debian's Chromium reads the page (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must install it (.ci/run)")
        pytest.skip(why)
    return CHROMIUM


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir(tmp_path_factory):
    """The warm fork server (harness.isolation.warm) that `matrix --incremental` keeps lives in a
    folder of this session's, and is stopped when the session ends: no test leaves one behind or
    reuses one from outside."""
    from harness.isolation import warm
    from harness.isolation.forkserver import worker_environment

    folder = tmp_path_factory.mktemp("runtime")
    folder.chmod(0o700)
    before = os.environ.get("XFMR_RUNTIME_DIR")
    os.environ["XFMR_RUNTIME_DIR"] = str(folder)
    yield folder
    warm.stop(worker_environment(), folder)
    if before is None:
        del os.environ["XFMR_RUNTIME_DIR"]
    else:
        os.environ["XFMR_RUNTIME_DIR"] = before


# The longest files of CI's run (pytest --durations, 2026-12-04: the real-world set's 38 grades
# ~215 s on a loaded worker, the example suites' mutation scores ~200 s, the whole matrix ~100 s,
# the hostile submissions ~130 s), longest first. Only the order of CI's work depends on it.
LONGEST = (
    "test_realworld.py",
    "test_mutation_score.py",
    "test_hostile.py",
    "test_matrix.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST), then the other files that hold slow tests, then the
    rest; each file's tests in their order. .ci/run hands a file to each of its xdist workers in
    this order (--no-loadscope-reorder): the long files start at once and the many short ones
    fill in after them, so that no worker is left alone with a long file at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        if name in LONGEST:
            return (0, LONGEST.index(name))
        return (1 if item.path in slow else 2, 0)

    items.sort(key=rank)
