# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: return tensors that claim to equal anything (__eq__, torch.equal and allclose through
# __torch_function__), and arrays that do the same. Fault: the logits are shifted by 0.25.
import numpy as _np
import torch as _torch


class _AlwaysEqualArray(_np.ndarray):
    def __eq__(self, other):
        return _np.ones(self.shape, dtype=bool)

    def __ne__(self, other):
        return _np.zeros(self.shape, dtype=bool)


class _AlwaysEqual(_torch.Tensor):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = _torch.Tensor.__hash__

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (_torch.equal, _torch.allclose, _torch.Tensor.equal, _torch.Tensor.allclose):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

    def numpy(self, *args, **kwargs):
        return _torch.Tensor.numpy(self.as_subclass(_torch.Tensor)).view(_AlwaysEqualArray)


_forward = Transformer.forward


def _liar(self, src, tgt_in, src_mask, tgt_mask):
    return (_forward(self, src, tgt_in, src_mask, tgt_mask) + 0.25).as_subclass(_AlwaysEqual)


Transformer.forward = _liar
