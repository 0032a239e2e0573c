"""What one worker may use (`Limits`): plain data at the bottom of the imports, with nothing of
the sandbox in it, so the options, the records, the grading procedure and both tiers share it.

The sandbox (harness.isolation.sandbox), the container tier (harness.isolation.container) and a
student's own machine (harness.isolation.local) each enforce what they can of it; the worker
applies `confine()` itself (harness.isolation.child.confine) before any subject code. Not the
wire format's `harness.wire.Limits`: those cap what one frame may cost its reader, on both sides
of the trust boundary (the worker's code may import this package's `__init__` and the wire
format only, never this module).
"""

from __future__ import annotations

from dataclasses import dataclass

# The project's top-level packages: masked wherever the interpreter's paths hold them, and refused
# to a subject's imports (confine()'s "protected").
PROJECT_PACKAGES = ("impl", "oracle", "harness", "mutants", "tasks", "demos")

# torch's own resident pages in a worker once it is imported, which the cgroup's default bound
# allows for beside what the limits let a subject fill (measured RSS after `import torch`:
# 219 MiB for 2.13.0+cpu, 505 MiB for 2.14.1+cu130).
RESIDENT_BASE_MB = 512


@dataclass(frozen=True)
class Limits:
    """What one worker may use. Wall time is per test and lives on the tests."""

    # The address space a worker may map beyond what it has mapped once torch, the probes and
    # the worker's own modules are imported (harness.isolation.child.confine sets RLIMIT_AS to
    # that plus this): torch's own mappings differ by build (0.6 GiB for 2.13.0+cpu, 3.1 GiB
    # for 2.14.1+cu130, the build a plain `pip install torch` gives on Linux, no GPU needed) and
    # are not the subject's. A whole grade of examples/correct_submission.py adds ~60 MiB
    # (VmPeak 681 MB over an import-time 625 MB, CPU build); 1.5 GiB leaves room and stops a
    # memory bomb after touching at most 1.5 GiB, seconds of page faults on a loaded machine.
    memory_mb: int = 1536
    # Largest file the worker may write (save_transformer of a tiny model is kilobytes).
    file_mb: int = 64
    # The private /tmp: a tmpfs is memory, which RLIMIT_AS does not count.
    tmp_mb: int = 256
    # Processes and threads of the sandbox's user: torch's pool plus a few, never a fork bomb
    # (counted per user namespace, so only the sandbox's own processes count); the worker's
    # cgroup holds its tasks (threads included) to the same figure.
    processes: int = 256
    # Memory of every kind the worker's cgroup may hold (harness.isolation.cgroups): resident
    # pages, tmpfs (/tmp, /dev/shm), memfd and SysV shared memory, page cache it reads in.
    # 0: memory_mb + tmp_mb + shm_mb + RESIDENT_BASE_MB, what the other limits already let a
    # worker fill on top of torch's own resident pages: the
    # cgroup adds no bound on what they count (an address-space bomb still ends in a clean
    # MemoryError: measured, a 1 GiB cgroup turned hostile_memory's into page-cache thrashing
    # and a timeout) and closes the kinds none of them counts. A worker grading
    # examples/correct_submission.py peaks at 232 MiB in its cgroup (measured; 2368 MiB is 10x).
    ram_mb: int = 0
    # /dev/shm, a size-limited tmpfs of its own (Python's semaphores live there; kilobytes).
    shm_mb: int = 64

    def __post_init__(self) -> None:
        if self.ram_mb == 0:
            filled = self.memory_mb + self.tmp_mb + self.shm_mb + RESIDENT_BASE_MB
            object.__setattr__(self, "ram_mb", filled)
        for name in ("memory_mb", "file_mb", "tmp_mb", "processes", "ram_mb", "shm_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The fixed limits as setrlimit arguments (soft = hard: the subject cannot raise them);
        the address space is set relative to the worker's own mappings (confine())."""
        mb = 1 << 20
        return {
            "RLIMIT_FSIZE": (self.file_mb * mb, self.file_mb * mb),
            "RLIMIT_NPROC": (self.processes, self.processes),
            "RLIMIT_CORE": (0, 0),  # a segfault leaves no core file behind
        }

    def confine(self) -> dict:
        """The worker's own confinement request (harness.isolation.child.confine)."""
        return {
            "rlimits": {k: list(v) for k, v in self.rlimits().items()},
            "address_space_headroom_mb": self.memory_mb,
            "dir": "/tmp",
            "protected": list(PROJECT_PACKAGES),
        }


DEFAULT_LIMITS = Limits()
