"""The isolation tiers an untrusted run can choose (`--isolation`): one record each, chosen here.

A tier says how a worker starts on a staged input, how to prove it can be set up here, what
every report calls it, which limits it lacks where no cgroup can be made, what staff should do
when it cannot be set up, and whether all its workers run as one user (then a grade runs no test
apart, and the user's processes are swept from root when the grade ends). Adding a tier is one
record in TIERS (CONTRIBUTING.md); the jobs, the options and the autograders read these fields,
never the tier's name.

Running trusted code without either (`--unsafe-no-sandbox`) is not a tier of `--isolation`: its
record, UNSAFE, stands outside TIERS (`NAMED` holds all three); its workers fork from the trusted
fork server, and every report says UNSAFE. Callers pass one of these records, never a name and a
flag; the names and the reports' words live below everything, in tier_names.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import cgroups, container, tier_names
from harness.isolation.forkserver import forked
from harness.isolation.limits import PROJECT_PACKAGES, Limits
from harness.isolation.sandbox import (
    CHILD_FILES,
    CHILD_PACKAGE,
    INPUT,
    PROJECT_ROOT,
    check,
    interpreter,
    python_paths,
    sandboxed,
)
from harness.isolation.worker import Start


@dataclass(frozen=True)
class Tier:
    name: str  # --isolation's value (UNSAFE's is not one), what `xfmr autograder probe` records
    described: str  # how every report says the workers ran
    one_user: bool  # every worker runs as one user: ending one ends all; swept when a grade ends
    # (stage, limits) -> how a worker starts on the staged input, and where it finds it inside
    start: Callable[[Path, Limits], tuple[Start, Path]]
    trial: Callable[[Sequence[Path]], None]  # raises unless it can be set up here (hidden folders)
    lacks: str  # what a worker lacks where no cgroup per worker can be made
    fix: str  # what to do when it cannot be set up
    isolated: bool = True  # False only for UNSAFE: trusted code, forked without either tier

    def limits_problem(self) -> str:
        """Which limits a worker lacks here and why ("" when each gets its cgroup, or when the
        run is not isolated at all: UNSAFE says so itself): said in every report of a run."""
        if not self.isolated:
            return ""
        why = cgroups.problem()
        return f"LIMITS MISSING: no cgroup per worker ({why}): {self.lacks}" if why else ""


def _container_code() -> container.Code:
    """What a container-tier worker runs: this interpreter and the worker's own files."""
    files = {rel: PROJECT_ROOT / rel for rel in (*CHILD_FILES, CHILD_PACKAGE)}
    return container.Code(interpreter(), tuple(python_paths()), files, PROJECT_PACKAGES)


SANDBOX = Tier(
    name=tier_names.SANDBOX,
    described=tier_names.DESCRIBED[tier_names.SANDBOX],
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
    name=tier_names.CONTAINER,
    described=tier_names.DESCRIBED[tier_names.CONTAINER],
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


def _no_trial(hidden: Sequence[Path]) -> None:
    """Forking trusted code needs nothing of the machine: nothing to prove."""


UNSAFE = Tier(
    name=tier_names.UNSAFE,
    described=tier_names.DESCRIBED[tier_names.UNSAFE],
    one_user=False,
    start=lambda stage, limits: (forked, stage),  # rlimits only, at the stage itself
    trial=_no_trial,
    lacks="every limit but the worker's own rlimits",
    fix="",
    isolated=False,
)
# every record by name, UNSAFE included: what crosses to a remote unit (a Dask worker)
NAMED = {**TIERS, UNSAFE.name: UNSAFE}


def tier(name: str) -> Tier:
    """The tier of this name (`--isolation`'s choices); ValueError naming them otherwise."""
    try:
        return TIERS[name]
    except KeyError:
        raise ValueError(f"isolation is one of {tuple(TIERS)}, not {name!r}") from None
