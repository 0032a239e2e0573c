"""The float64 numpy oracle of the encoder-decoder Transformer (Vaswani et al. 2017).

Read top to bottom: ops.py (the primitives), layers.py (sublayers and layers), model.py (the
stacks), decoding.py (KV-cached steps, beam search), loss.py (label smoothing, Noam),
grads.py (the backward pass, chained from the backwards beside each forward), params.py,
precision.py (each dtype's arithmetic), roundoff.py (the rounding model: how far an honest
subject in float32, bfloat16 or float16 may be from any oracle function, gradients included) and
error_bounds.py (its view of the forward pass and the loss). Then
readers/ (state_dict.py: any subject's parameters; marian.py: Hugging Face Marian checkpoints)
and adapters/ (flax_block.py: seed 002's Flax pre-LN decoder block; depth_stacks.py: seed 004's
shared-weight stacks).
numpy only: no torch, no autograd.
"""

import oracle.readers.marian  # noqa: F401  (registers the Hugging Face Marian naming scheme)
from oracle.adapters.depth_stacks import (
    post_norm_block,
    pre_norm_block,
    stack_input_grad,
    stack_post_norm_blocks,
    stack_pre_norm_blocks,
)
from oracle.adapters.flax_block import flax_decoder_block
from oracle.decoding import (
    DecodeState,
    Hypothesis,
    beam_search,
    best_hypothesis,
    decode_step,
    init_state,
    translate,
)
from oracle.error_bounds import ForwardBounds, forward_bounds, label_smoothed_loss_bound
from oracle.grads import logits_loss_and_grads, loss_and_grads
from oracle.loss import label_smoothed_loss, noam_rate
from oracle.model import decode, encode, forward
from oracle.optim import adam_step, adam_step_bound
from oracle.params import ModelSpec, Params
from oracle.readers.state_dict import SCHEMES, StateDictError, read_state_dict, register_scheme
from oracle.roundoff import bounded

__all__ = [
    "SCHEMES",
    "DecodeState",
    "ForwardBounds",
    "Hypothesis",
    "ModelSpec",
    "Params",
    "StateDictError",
    "adam_step",
    "adam_step_bound",
    "beam_search",
    "best_hypothesis",
    "bounded",
    "decode",
    "decode_step",
    "encode",
    "flax_decoder_block",
    "forward",
    "forward_bounds",
    "init_state",
    "label_smoothed_loss",
    "label_smoothed_loss_bound",
    "logits_loss_and_grads",
    "loss_and_grads",
    "noam_rate",
    "post_norm_block",
    "pre_norm_block",
    "read_state_dict",
    "register_scheme",
    "stack_input_grad",
    "stack_post_norm_blocks",
    "stack_pre_norm_blocks",
    "translate",
]
