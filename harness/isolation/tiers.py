"""The isolation tiers an untrusted run can choose (`--isolation`): one record each, chosen here.

A tier says how a worker starts on a staged input, how to prove it can be set up here, what
every report calls it, which limits it lacks where no cgroup can be made, what staff should do
when it cannot be set up, and whether all its workers run as one user (then a grade runs no test
apart, and the user's processes are swept from root when the grade ends). Adding a tier is one
record in TIERS (CONTRIBUTING.md); the jobs, the options and the autograders read these fields,
never the tier's name.

Running trusted code without either (`--unsafe-no-sandbox`) is not a tier: `starter` forks it
from the trusted fork server, and every report says UNSAFE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import cgroups, container
from harness.isolation.forkserver import forked
from harness.isolation.sandbox import (
    CHILD_FILES,
    CHILD_PACKAGE,
    INPUT,
    PROJECT_PACKAGES,
    PROJECT_ROOT,
    Limits,
    _interpreter,
    _python_paths,
    check,
    sandboxed,
)
from harness.isolation.worker import Start


@dataclass(frozen=True)
class Tier:
    name: str  # --isolation's value, and what `xfmr autograder probe` records
    described: str  # how every report says the workers ran
    one_user: bool  # every worker runs as one user: ending one ends all; swept when a grade ends
    start: Callable[[Path, Limits], tuple[Start, Path]]  # (stage, limits) -> start, its path inside
    trial: Callable[[Sequence[Path]], None]  # raises unless it can be set up here (hidden folders)
    lacks: str  # what a worker lacks where no cgroup per worker can be made
    fix: str  # what to do when it cannot be set up

    def limits_problem(self) -> str:
        """Which limits a worker lacks here and why ("" when each gets its cgroup): said in every
        report of a run."""
        why = cgroups.problem()
        return f"LIMITS MISSING: no cgroup per worker ({why}): {self.lacks}" if why else ""


def _container_code() -> container.Code:
    """What a container-tier worker runs: this interpreter and the worker's own files."""
    files = {rel: PROJECT_ROOT / rel for rel in (*CHILD_FILES, CHILD_PACKAGE)}
    return container.Code(_interpreter(), tuple(_python_paths()), files, PROJECT_PACKAGES)


SANDBOX = Tier(
    name="sandbox",
    described="bubblewrap sandbox, one per worker",
    one_user=False,
    start=lambda stage, limits: (sandboxed(stage, limits), Path(INPUT)),
    trial=lambda hidden: check(),
    lacks="no limit on a worker's memory beyond its address space, /tmp and /dev/shm "
    "(memfd_create and shmget refused instead), nor on its processes beyond RLIMIT_NPROC",
    fix="Install bubblewrap (apt-get install -y bubblewrap) where it is missing. Where it cannot "
    "start (a container that masks /proc or forbids user namespaces, as Docker does by default), "
    "choose the container tier explicitly: --isolation container, as root, with its user (see the "
    "README's Gradescope section).",
)
CONTAINER = Tier(
    name="container",
    described="container tier: a dedicated unprivileged user, no namespaces "
    "(--isolation container)",
    one_user=True,
    start=lambda stage, limits: (
        container.contained(stage, _container_code(), limits.ram_mb, limits.processes),
        stage,
    ),
    trial=lambda hidden: container.check(_container_code(), hidden),
    lacks="a worker's memory beyond its address space (memfd, shared memory, /dev/shm and /tmp "
    "files) is bounded only by the container's own limit, its processes only by RLIMIT_NPROC",
    fix="The container tier needs root, its user (created by the autograder's setup.sh) and the "
    "project and report folders out of that user's reach (see the README's Gradescope section).",
)
# in the order `xfmr autograder probe` tries them: the sandbox first (it also takes the network)
TIERS = {t.name: t for t in (SANDBOX, CONTAINER)}


def tier(name: str) -> Tier:
    """The tier of this name; ValueError naming the choices otherwise."""
    try:
        return TIERS[name]
    except KeyError:
        raise ValueError(f"isolation is one of {tuple(TIERS)}, not {name!r}") from None


def starter(
    stage: Path, limits: Limits, unsafe: bool = False, isolation: str = "sandbox"
) -> tuple[Start, Path]:
    """How an untrusted run's workers start on its staged input, and where they find it: as
    the chosen tier starts them (never a fallback), or, unsafe, forked from the trusted fork
    server (rlimits only), at the stage itself."""
    if unsafe:
        return forked, stage
    return tier(isolation).start(stage, limits)
