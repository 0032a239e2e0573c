"""How a subject's NotImplementedError reads in a report: a stub's unwritten definition by its
name; a module whose forward is misspelt or mis-indented by its class, with the likely cause; one
raised inside torch for another reason whole, where it was raised. Each error is described by the
worker's own `describe` from a real exception, as the parent receives it."""

from __future__ import annotations

import pytest
import torch

from harness.isolation.child.serve import describe
from harness.isolation.worker import NOT_IMPLEMENTED, SubjectRaised


def raised(fn) -> dict:
    with pytest.raises(Exception) as info:
        fn()
    return describe(info.value)


def test_a_stubs_definition_reads_by_its_name():
    def noam_rate():
        raise NotImplementedError("noam_rate")

    assert str(SubjectRaised("hand_example", raised(noam_rate))) == f"{NOT_IMPLEMENTED}noam_rate"


def test_a_bare_stub_reads_by_its_functions_name():
    def label_smoothed_loss():
        raise NotImplementedError

    said = str(SubjectRaised("hand_example", raised(label_smoothed_loss)))
    assert said == f"{NOT_IMPLEMENTED}label_smoothed_loss"


def test_a_module_without_forward_is_named_with_the_likely_cause():
    class EncoderLayer(torch.nn.Module):
        def foward(self, x):  # misspelt: nn.Module's placeholder forward raises
            return x

    error = raised(lambda: EncoderLayer()(torch.ones(1)))
    assert "/torch/" in error["where"]  # raised inside torch, not by the subject
    said = str(SubjectRaised("golden", error))
    assert said.startswith("EncoderLayer has no method named forward (torch: Module [EncoderLayer]")
    assert "check its spelling and that it is indented inside class EncoderLayer" in said
    assert NOT_IMPLEMENTED not in said


def test_another_not_implemented_inside_torch_is_said_whole_with_its_place():
    class Stepless(torch.optim.Optimizer):  # a subclass that never defined step
        pass

    error = raised(lambda: Stepless([torch.zeros(1, requires_grad=True)], {}).step())
    said = str(SubjectRaised("learn", error))
    assert said.startswith("learn: the subject raised NotImplementedError")
    assert "/torch/" in said and NOT_IMPLEMENTED not in said
