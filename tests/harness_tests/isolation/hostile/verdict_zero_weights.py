# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 21): a model whose every parameter starts at 0 and whose forward pass returns
# zeros through the parameters (so backward works). Against an oracle run on the subject's own
# weights, every expectation is trivial (logits 0, a loss of log V, gradients 0): judged on
# weights the parent draws and pushes in, it fails every value test.
_ZeroBase = Transformer


class Transformer(_ZeroBase):  # noqa: F811
    def __init__(self, cfg):
        super().__init__(cfg)
        with torch.no_grad():
            for p in self.parameters():
                p.zero_()

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        anchor = sum(p.sum() for p in self.parameters()) * 0.0
        shape = (tgt_in.shape[0], tgt_in.shape[1], self.cfg.tgt_vocab)
        return torch.zeros(shape, dtype=anchor.dtype) + anchor
