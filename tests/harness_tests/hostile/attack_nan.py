# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: weights that are all NaN, so that every expectation the oracle derives from them is NaN
# and every comparison with NaN is False ("NaN > tol" passes a naive check).
import torch as _torch

_Base = Transformer


class Transformer(_Base):
    def __init__(self, cfg):
        super().__init__(cfg)
        with _torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))
