# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: fill an anonymous memfd with 4 GiB in 64 MiB writes: its pages are no mapping, so
# RLIMIT_AS never sees them. Held: the worker's cgroup counts them; at its memory limit the
# kernel kills the worker, that test crashes with the reason, and grading goes on in a fresh
# sandbox.
import os as _os


def noam_rate(step, d_model, warmup, factor=1.0):
    fd = _os.memfd_create("fill")
    chunk = b"\1" * (64 << 20)
    for _ in range(64):  # 4 GiB
        _os.write(fd, chunk)
    return 0.0
