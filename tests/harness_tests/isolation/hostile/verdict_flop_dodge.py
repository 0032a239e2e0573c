# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 21): decode_step recomputes decode over the whole prefix at every step, its work
# hidden from any counter inside the process (torch's FlopCounterMode switched off for the
# call). Its logits are right; only the law (a KV cache, not a recomputed prefix) is broken.
from torch.utils._python_dispatch import _disable_current_modes as _no_modes  # noqa: E402

_DodgeBase = Transformer


class Transformer(_DodgeBase):  # noqa: F811
    def init_state(self, src_mask):
        empty = src_mask.new_zeros((src_mask.shape[0], 0), dtype=torch.long)
        return {"src_mask": src_mask, "prefix": empty}

    def decode_step(self, y_prev, memory, state):
        with _no_modes():
            prefix = torch.cat([state["prefix"], y_prev[:, None]], dim=1)
            mask = torch.ones_like(prefix, dtype=torch.bool)
            logits = self.decode(prefix, memory, state["src_mask"], mask)[:, -1]
        return logits, {"src_mask": state["src_mask"], "prefix": prefix}
