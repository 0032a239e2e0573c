# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: allocate far more memory than the machine has, both through Python and through
# torch. Fault: Noam counted from n = step (s08).
import torch as _torch


def noam_rate(step, d_model, warmup, factor=1.0):
    hoard = [bytearray(1 << 30) for _ in range(1 << 10)]  # 1 TiB, a GiB at a time
    return len(hoard)


def _hoard(self, *args, **kwargs):
    return _torch.ones(1 << 40, dtype=_torch.float64)  # 8 TiB


Transformer.forward = _hoard
