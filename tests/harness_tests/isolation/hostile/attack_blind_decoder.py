# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: logits that ignore the targets: the mean of the encoder's memory over the real source
# positions, read through the output layer, at every position. Laws that compare a subject only
# with itself (changing later targets changes nothing earlier; decode_step equals decode) hold
# trivially for it; decode_step goes through this decode too.
_Base = Transformer


class Transformer(_Base):
    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        _Base.decode(self, tgt_in, memory, src_mask, tgt_mask)  # the contract's checks
        real = src_mask[..., None].to(memory.dtype)
        mean = (memory * real).sum(1) / real.sum(1)
        logits = mean @ self._out_weight().T
        return logits[:, None, :].expand(-1, tgt_in.shape[1], -1).clone()
