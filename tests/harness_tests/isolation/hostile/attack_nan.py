# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: logits that are all NaN, so that a naive check ("NaN > tol" is False) passes them. (It
# once filled the weights with NaN, so that every expectation the oracle derived from them was
# NaN too; the value tests now run on weights the parent pushes in, which makes that moot.)
import torch as _torch

_Base = Transformer


class Transformer(_Base):
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * _torch.tensor(float("nan"))
