"""Parameters, gradients and modules matched to the contract's names by what the tensors are
(harness/isolation/child/probes/base.py and hooks.py), whatever the attributes are called."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from harness.isolation.child.probes.base import gradients, parameter_views
from harness.isolation.child.probes.hooks import (
    SharedCall,
    contract_modules,
    first_calls,
    query_first,
)


class Layer(nn.Module):
    """An encoder layer with other attribute names: a fused q/k/v, fc1, ln."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.in_proj = nn.Parameter(torch.randn(3 * d, d, dtype=torch.float64))
        self.fc1 = nn.Linear(d, d, dtype=torch.float64)
        self.ln = nn.LayerNorm(d, dtype=torch.float64)

    def forward(self, x):
        q, k, v = (x @ self.in_proj.T).chunk(3, dim=-1)
        return self.ln(self.fc1(q * k + v))


class Model(nn.Module):
    """Layers that may be one module; the state_dict renamed by a hook, q/k/v handed out as
    views of the fused projection."""

    def __init__(self, shared: bool):
        super().__init__()
        one = Layer()
        self.stack = nn.ModuleList([one, one] if shared else [one, Layer()])
        self._register_state_dict_hook(self._contract_names)

    @staticmethod
    def _contract_names(module, state, prefix, meta):
        for key in list(state):
            i, rest = key.split(".")[1], key.split(".", 2)[2]
            value = state.pop(key)
            if rest == "in_proj":
                for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                    state[f"encoder.{i}.self_attn.{name}.weight"] = value[j * 4 : (j + 1) * 4]
            else:
                rest = rest.replace("fc1.", "linear1.").replace("ln.", "norm1.")
                state[f"encoder.{i}.{rest}"] = value
        return state

    def forward(self, x):
        for layer in self.stack:
            x = layer(x)
        return x


def test_each_gradient_is_keyed_by_the_state_dict_name_whose_tensor_is_the_parameter():
    torch.manual_seed(0)
    model = Model(shared=False)
    model(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    views = parameter_views(model)
    assert views["encoder.1.linear1.weight"][0] == "stack.1.fc1.weight"
    assert views["encoder.0.self_attn.k_proj.weight"][0] == "stack.0.in_proj"
    got = gradients(model)
    assert set(got["grads"]) == set(model.state_dict()) and got["shared"] == []
    fused = model.stack[0].in_proj.grad.numpy()
    assert np.array_equal(got["grads"]["encoder.0.self_attn.k_proj.weight"], fused[4:8])
    assert np.array_equal(got["grads"]["encoder.1.norm1.bias"], model.stack[1].ln.bias.grad.numpy())


def test_names_of_one_tensor_get_its_gradient_and_are_said_to_share_it():
    torch.manual_seed(0)
    model = Model(shared=True)
    model(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    got = gradients(model)
    assert ["encoder.0.linear1.weight", "encoder.1.linear1.weight"] in got["shared"]
    a, b = got["grads"]["encoder.0.linear1.weight"], got["grads"]["encoder.1.linear1.weight"]
    assert np.array_equal(a, b)


def test_modules_are_found_by_their_parameters_and_one_module_is_hooked_per_call():
    model = Model(shared=False)
    found = contract_modules(model)
    assert found["encoder.1"] is model.stack[1] and found["encoder.0.linear1"] is model.stack[0].fc1
    assert found["encoder.1.norm1"] is model.stack[1].ln
    shared = Model(shared=True)
    found = contract_modules(shared)
    assert isinstance(found["encoder.1"], SharedCall)
    x = torch.randn(2, 4, dtype=torch.float64)
    seen = first_calls(shared, lambda name: name in ("encoder.0", "encoder.1"))
    with torch.no_grad():
        shared(x)  # the module's first call is layer 0's, its second layer 1's
        after_first = shared.stack[0](x)
    assert np.allclose(seen["encoder.0"]["inputs"][0], x.numpy())
    assert np.allclose(seen["encoder.1"]["inputs"][0], after_first.numpy())


def test_the_query_is_recorded_first_whatever_order_the_attention_takes():
    # OpenNMT's attention is called (key, value, query), fairseq's (query, key, value): the
    # query is the input shaped as the output, the one passed once beside a memory given twice
    memory, y = torch.zeros(2, 7, 4), torch.ones(2, 6, 4)
    out, square = torch.ones(2, 6, 4), torch.zeros(2, 6, 4)  # a memory as long as the target

    def order(tensors, output):
        return [
            "memory" if t is memory or t is square else "y" for t in query_first(tensors, output)
        ]

    assert order([memory, memory, y], out) == ["y", "memory", "memory"]
    assert order([y, memory, memory], out) == ["y", "memory", "memory"]
    assert order([y, memory], out) == ["y", "memory"]
    assert order([memory, y], out) == ["y", "memory"]
    assert order([y, y, y], out) == ["y", "y", "y"]
    memory = square
    assert order([memory, memory, y], out) == ["y", "memory", "memory"]
    assert order([y, memory], out) == ["y", "memory"]  # no clue but the order: the contract's


def test_an_onmt_cross_attention_is_read_with_its_query_and_memory():
    from realworld import run_set

    from harness.isolation.child import probes
    from harness.isolation.child.load import from_source
    from harness.shared_tests.inputs import GOLDEN_SEED, forward_inputs, golden_inputs

    module = from_source(run_set.base_source("onmt.py"), "<onmt>", name="xfmr_onmt_base")
    name, cfg, b = next(iter(golden_inputs()))
    answer = probes.PROBES["module_outputs"](module, cfg=cfg, seed=GOLDEN_SEED, **forward_inputs(b))
    (B, S), T = b["src"].shape, b["tgt_in"].shape[1]
    assert S != T, "the golden inputs no longer tell the memory from the query by shape"
    for i in range(cfg["n_dec"]):
        query, keys = answer["inputs"][f"decoder.{i}.cross_attn"][:2]
        assert query.shape == (B, T, cfg["d_model"]) and keys.shape == (B, S, cfg["d_model"])
