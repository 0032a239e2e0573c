# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: hang (a busy loop that never yields) when the schedule is asked for. Fault: the
# decoder's output is scaled (every golden comparison differs).


def noam_rate(step, d_model, warmup, factor=1.0):
    while True:
        pass


_forward = Transformer.forward


def _scaled(self, src, tgt_in, src_mask, tgt_mask):
    return _forward(self, src, tgt_in, src_mask, tgt_mask) * 1.01


Transformer.forward = _scaled
