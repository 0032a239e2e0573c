# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: fill anonymous memfds with 4 GiB, 64 MiB each (one file stays within RLIMIT_FSIZE):
# their pages are no mapping, so RLIMIT_AS never sees them. Held: the worker's cgroup counts
# them; at its memory limit the kernel kills the worker, that test fails with the reason, and
# grading goes on in a fresh sandbox.
import os as _os

_held = []


def noam_rate(step, d_model, warmup, factor=1.0):
    chunk = b"\1" * (64 << 20)
    for i in range(64):  # 4 GiB
        fd = _os.memfd_create(f"fill{i}")
        _os.write(fd, chunk)
        _held.append(fd)
    return 0.0
