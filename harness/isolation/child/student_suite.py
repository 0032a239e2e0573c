"""The worker's half of `xfmr mutation-score`: a student's pytest suite run on one loaded subject.

The probe `student_suite` makes the subject importable under the module path the suite expects
(tinyllm.xfmr.transformer unless told otherwise), offers it as the fixture `transformer`, pins
Hypothesis to one profile (derandomized, no deadline, no database) and runs pytest in this
process. A small plugin streams each test's start and result to the parent over the reply
pipe as they happen (channel.emit), so a test that hangs or kills the worker costs only
itself: the parent restarts the suite after it, skipping the tests already reported.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

import hypothesis
import pytest

from harness.isolation.child import channel, probes

PROFILE = "xfmr-mutation-score"
# derandomize: the same examples on every subject and every run, so a score is reproducible;
# no deadline: a loaded machine must not turn slowness into failures; no database: examples
# found on one subject must not be replayed on the next
hypothesis.settings.register_profile(
    PROFILE, derandomize=True, deadline=None, database=None, print_blob=False
)


def alias(module: ModuleType, dotted: str) -> None:
    """Make `module` importable as `dotted`, creating empty parent packages as needed."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            package = ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
    sys.modules[dotted] = module
    for i in range(1, len(parts)):
        setattr(sys.modules[".".join(parts[:i])], parts[i], sys.modules[".".join(parts[: i + 1])])


class Reporter:
    """A pytest plugin: the `transformer` fixture, the Hypothesis profile, skipping, streaming."""

    def __init__(self, module: ModuleType, skip: set[str]) -> None:
        self.module = module
        self.skip = skip
        self.phases: dict[str, list[Any]] = {}
        self.started: dict[str, float] = {}

    @pytest.fixture(name="transformer", scope="session")
    def transformer(self) -> ModuleType:
        return self.module

    def pytest_configure(self, config: pytest.Config) -> None:
        hypothesis.settings.load_profile(PROFILE)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # a conftest may have loaded its own profile: ours wins
        hypothesis.settings.load_profile(PROFILE)
        items[:] = [item for item in items if item.nodeid not in self.skip]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        channel.emit({"event": "collected", "nodeids": [item.nodeid for item in session.items]})

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.started[nodeid] = time.monotonic()
        self.phases[nodeid] = []
        channel.emit({"event": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        reports = self.phases.pop(nodeid, [])
        failed = [r for r in reports if r.failed]
        if failed:
            outcome, message = "failed", f"{failed[0].when}: {failed[0].longreprtext}"
        elif any(r.skipped for r in reports):
            outcome, message = "skipped", ""
        else:
            outcome, message = "passed", ""
        channel.emit(
            {
                "event": "result",
                "nodeid": nodeid,
                "outcome": outcome,
                "message": message[-3000:],  # the end of a traceback says the most
                "seconds": time.monotonic() - self.started.get(nodeid, time.monotonic()),
            }
        )


def constants_from_the_suite_alone() -> bool:
    """Count every module loaded so far (the interpreter's, torch, this worker, the subject) as
    one Hypothesis has read its constants from, so that they come from the suite's own modules
    alone; False if this Hypothesis keeps no such record.

    Hypothesis draws some examples from the literals of every 'local' module, one not under
    site-packages: it parses their source, at the first collection. In a sandbox the import
    folders sit at neutral paths, so it parsed all of torch, about a thousand modules, 7-10 s for
    each subject of a mutation score. And everywhere the subject was one of them: each mutant's
    literals changed the examples, where every subject must meet the same ones."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return False
    seen = getattr(providers, "_seen_modules", None)
    if not isinstance(seen, set):
        return False
    seen.update(id(m) for m in list(sys.modules.values()))
    return True


@probes.probe
def student_suite(module, tests_dir, module_name, skip) -> dict[str, Any]:
    """Run the suite in `tests_dir` on the subject; each test's result streams as it ends."""
    alias(module, module_name)
    constants_from_the_suite_alone()
    args = [
        tests_dir,
        "-q",
        "-p",
        "no:cacheprovider",  # nothing written next to the suite, nothing read from a past run
        "-p",
        "no:warnings",  # the report a broken suite gets quoted is pytest's errors, not warnings
        "-o",
        "addopts=",
        "--rootdir",
        tests_dir,
    ]
    code = pytest.main(args, plugins=[Reporter(module, set(skip))])
    for stream in (sys.stdout, sys.stderr):  # pytest's own report, for the parent to quote
        stream.flush()
    return {"exit": int(code)}
