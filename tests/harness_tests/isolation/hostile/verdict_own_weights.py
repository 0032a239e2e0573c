# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 21): a model that keeps its own initialization whatever it is given: its
# load_state_dict accepts the parent's weights and silently keeps its own. A grader that reads
# the weights back from the model (instead of the ones it pushed) judges the model's own init.
_OwnBase = Transformer


class Transformer(_OwnBase):  # noqa: F811
    def load_state_dict(self, state_dict, strict=True, assign=False):
        return None
