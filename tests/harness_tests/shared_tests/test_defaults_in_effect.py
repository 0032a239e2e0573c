"""The defaults law judges what a function does with an argument left out, not what its signature
says: a signature that lies about a default fails it, one that hides an honest default (a wrapper
without functools.wraps) passes, and a default that differs in effect is named."""

from __future__ import annotations

import pytest

from harness.isolation.child import probes
from harness.isolation.child.load import from_source
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.record import Failure
from harness.subjects import module_source

SOURCE = module_source("impl.transformer")[1]
LAW = BY_NAME["test_defaults_are_the_contracts"]


def subject(extra: str = "", old: str = "", new: str = ""):
    """impl with `old` replaced by `new` (once) and `extra` appended."""
    source = SOURCE
    if old:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return from_source(source + extra, "<impl variant>", name="xfmr_defaults_variant")


def check(module) -> None:
    LAW.check(lambda probe, **inputs: probes.PROBES[probe](module, **inputs))


def test_impl_passes():
    check(subject())


def test_a_wrapper_that_hides_the_signature_is_no_fault():
    hidden = """
def _plain_wrapper(fn):
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapped

translate = _plain_wrapper(translate)
noam_rate = _plain_wrapper(noam_rate)
fit = _plain_wrapper(fit)
"""
    check(subject(hidden))


def test_a_signature_that_lies_about_a_default_fails():
    # the signature shows the contract's factor=1.0; left out, the factor in effect is 2
    lying = """
import inspect as _inspect
_noam = noam_rate

def noam_rate(step, d_model, warmup, factor=None):
    return _noam(step, d_model, warmup, 2.0 if factor is None else factor)

noam_rate.__signature__ = _inspect.signature(_noam)
"""
    # judged against the oracle at the contract's factor=1.0, at drawn inputs
    left_out = r"noam_rate\(step=\d+, d_model=\d+, warmup=\d+\) with factor left out = .*2 times"
    with pytest.raises(Failure, match=left_out):
        check(subject(lying))


def test_a_fit_whose_warmup_in_effect_differs_fails_and_says_so():
    lying = """
import inspect as _inspect
_fit = fit

def fit(model, src, tgt, steps, batch, pad_id, warmup=None, **kw):
    return _fit(model, src, tgt, steps, batch, pad_id, 1 if warmup is None else warmup, **kw)

fit.__signature__ = _inspect.signature(_fit)
"""
    with pytest.raises(Failure, match=r"fit\(\) with warmup\b.* left out"):
        check(subject(lying))


def test_a_missing_default_is_named():
    old = "    beam_size: int = 1,\n    length_penalty: float = 1.0,\n"
    assert SOURCE.count(old) == 1
    module = subject(old=old, new="    beam_size: int,\n    length_penalty: float = 1.0,\n")
    missing = r"translate\(\) with beam_size( and length_penalty)? left out.* raised TypeError"
    with pytest.raises(Failure, match=missing):
        check(module)


def test_a_fit_that_does_not_repeat_itself_is_left_to_the_fit_test():
    # every call of fit draws anew (a counter of calls): not a fault of its defaults, and the
    # fit test's charge (same seed, same losses), not this law's
    counting = """
_fit = fit
_calls = [0]

def fit(*args, **kw):
    _calls[0] += 1
    torch.manual_seed(_calls[0])
    kw["seed"] = _calls[0]
    return _fit(*args, **kw)
"""
    check(subject(counting))
