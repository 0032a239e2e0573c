# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: crash the process with a segmentation fault (read address 0). Fault: Noam counted
# from n = step (s08).
import ctypes as _ctypes


def noam_rate(step, d_model, warmup, factor=1.0):
    n = max(step, 1e-12)
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def _segfault(self, *args, **kwargs):
    return _ctypes.string_at(0)


Transformer.forward = _segfault
