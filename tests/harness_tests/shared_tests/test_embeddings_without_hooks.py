"""The value tests where the values cannot be read plainly.

A submission whose layer modules are never called (a functional style): the embeddings test sees
x0 only through the final norm of the pre-LN model whose sublayers output 0, so a final norm
that is not the contract's (missing, another eps) must not be charged as an x0 fault (one cause,
one charge: the golden test owns it), while a wrong x0 still fails. A submission whose eval mode
is random (dropout left on): the value tests say they cannot judge and name the dropout law.

impl with one fault written in, run in this process through the same probes a grader's worker
runs (for the first: its module hooks' record of x0 and y0 removed, as if no layer module had
been called).
"""

from __future__ import annotations

import pytest

from harness.isolation.child import probes
from harness.isolation.child.load import from_source
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.record import Failure
from harness.subjects import module_source

SOURCE = module_source("impl.transformer")[1]
EMBEDDINGS = BY_NAME["test_embeddings_scaled_and_tied"]


def unhooked(*patches: tuple[str, str]):
    """A call into impl (patched) whose embedding_stream answer has no hooked x0 or y0."""
    source = SOURCE
    for old, new in patches:
        assert source.count(old) == 1, f"impl no longer holds {old!r} once"
        source = source.replace(old, new)
    module = from_source(source, "<impl variant>", name="xfmr_unhooked_variant")

    def call(probe: str, **kw):
        answer = probes.PROBES[probe](module, **kw)
        if probe == "embedding_stream":
            answer.update(x0=None, y0=None)
        return answer

    return call


FINAL_NORM_FAULTS = {
    "enc_norm never applied": [
        ('        if self.cfg.norm == "pre":\n            x = self.enc_norm(x)\n', "")
    ],
    "final norms with another eps": [
        (
            "self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
            "self.enc_norm = nn.LayerNorm(d, eps=1e-2) if pre else None",
        ),
        (
            "self.dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
            "self.dec_norm = nn.LayerNorm(d, eps=1e-2) if pre else None",
        ),
    ],
    "dec_norm never applied": [
        (
            '        if self.cfg.norm == "pre":\n            y = self.dec_norm(y)',
            "        if False:\n            y = self.dec_norm(y)",
        )
    ],
}


def test_a_right_x0_passes_without_hooks():
    EMBEDDINGS.check(unhooked())


@pytest.mark.parametrize("fault", sorted(FINAL_NORM_FAULTS))
def test_a_final_norm_fault_is_not_charged_as_x0(fault):
    EMBEDDINGS.check(unhooked(*FINAL_NORM_FAULTS[fault]))


def test_a_wrong_x0_still_fails_without_hooks():
    call = unhooked(
        (
            "x = F.embedding(ids, table) * math.sqrt(self.cfg.d_model)  # [B, T, d]",
            "x = F.embedding(ids, table)  # not scaled",
        )
    )
    with pytest.raises(Failure, match="seen here only through enc_norm"):
        EMBEDDINGS.check(call)


@pytest.mark.parametrize("test", ["test_embeddings_scaled_and_tied", "test_golden_torch"])
def test_a_random_eval_mode_is_the_dropout_laws_not_the_values(test):
    # dropout that acts in eval mode too (F.dropout's default training=True): no one function
    # to compare, so the value tests say they cannot judge and name the dropout law
    call = unhooked(
        ("        return self.dropout(x)\n", "        return F.dropout(x, self.cfg.dropout)\n")
    )
    with pytest.raises(Failure, match="not judged: test_dropout_only_in_training must pass"):
        BY_NAME[test].check(call)
