"""harness.jobs.disguise: the rewrites a mutation-score run draws keep every subject's behaviour."""

from __future__ import annotations

import random

import pytest
import torch

from harness.isolation.child.load import from_source
from harness.jobs.disguise import disguise
from harness.subjects import module_source

OVERLOADED = """
from typing import overload

@overload
def f(x: int) -> int: ...
@overload
def f(x: str) -> str: ...
def f(x):
    return x * 2

def g():
    return 1

def g():
    return 2
"""


def test_overloads_and_redefinitions_keep_their_order_under_every_draw():
    # the last definition of a name is the one that stands: shuffled behind an overload stub, a
    # function raises typing's NotImplementedError (the torch copy's state_dict did, 2026-12-02)
    for seed in range(200):
        module = from_source(disguise(OVERLOADED, random.Random(seed)), "<overloaded>", "ov")
        assert module.f(3) == 6 and module.f("a") == "aa" and module.g() == 2, seed


@pytest.mark.parametrize("name", ["impl.transformer", "impl.torch_copy"])
def test_a_disguised_subject_gives_the_same_state_dict_and_logits(name):
    _, source = module_source(name)
    original = from_source(source, f"<{name}>", "original")
    cfg = {"src_vocab": 11, "tgt_vocab": 11, "d_model": 8, "n_heads": 2, "d_ff": 16}
    src = torch.tensor([[3, 4, 5, 0]])
    tgt = torch.tensor([[1, 6, 7]])

    def run(module):
        torch.manual_seed(0)
        model = module.Transformer(module.TransformerConfig(n_enc=1, n_dec=1, **cfg)).eval()
        with torch.no_grad():
            logits = model(src, tgt, src != 0, tgt != 0)
        return {k: v.clone() for k, v in model.state_dict().items()}, logits

    want_state, want_logits = run(original)
    for seed in range(12):
        text = disguise(source, random.Random(seed))
        assert text != source
        state, logits = run(from_source(text, f"<disguised {name}>", f"disguised{seed}"))
        assert list(state) == list(want_state), seed
        assert all(torch.equal(state[k], want_state[k]) for k in state), seed
        assert torch.equal(logits, want_logits), seed
