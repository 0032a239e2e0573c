"""The interface laws: the state_dict's names and shapes, the contract's defaults, and bad input
through every entry point."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.shared_tests.inputs import (
    BOS,
    EOS,
    PAD,
    batch,
    config,
    contract_defaults,
    contract_shapes,
    pushed_weights,
    tying,
)
from harness.shared_tests.record import Call, Failure, law
from harness.shared_tests.verdicts import (
    listing,
)


@law(
    "test_parameter_names_follow_the_norm",
    "exactly the contract's names and shapes, each a tensor of its own; pre-LN adds exactly "
    "enc_norm and dec_norm",
    timeout=20.0,
)
def check_parameter_names_follow_the_norm(call: Call) -> None:
    # The state_dict holds exactly the contract's names and shapes, no two of them one tensor
    # (every layer its own parameters); pre-LN adds exactly enc_norm and dec_norm; decoder
    # layers have cross_attn and norm3.
    cfgs = [
        config(n_enc=2, n_dec=1),
        config(n_enc=2, n_dec=1, norm="pre"),
        config(n_enc=1, n_dec=2, norm="pre", src_vocab=11),
        config(n_enc=1, n_dec=2, tie_embeddings=False, tgt_vocab=11),
    ]
    got_all = call("state_dict_shapes", cfgs=cfgs)
    buffers = call("buffer_names", cfgs=cfgs)
    for cfg, got, held in zip(cfgs, got_all, buffers, strict=True):
        want = contract_shapes(cfg)
        label = f"{cfg['norm']}-LN, {cfg['n_enc']}+{cfg['n_dec']} layers, tie {tying(cfg)}"
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        if missing or extra:
            parts = [f"missing {listing(missing)}" if missing else ""]
            parts.append(f"unexpected {listing(extra)}" if extra else "")
            said = "; ".join(x for x in parts if x)
            raise Failure(
                f"{label}: the state_dict's names: {said}{names_advice(cfg, missing, extra, held)}"
            )
        for name, shape in want.items():
            if tuple(got[name]) != shape:
                raise Failure(f"{label}: {name} has shape {tuple(got[name])}, expected {shape}")
    for cfg, layout in zip(cfgs, call("parameter_layout", cfgs=cfgs), strict=True):
        shared = {n: first for n, first in layout["aliases"].items() if first != n}
        if shared:
            label = f"{cfg['norm']}-LN, {cfg['n_enc']}+{cfg['n_dec']} layers, tie {tying(cfg)}"
            pairs = [f"{n} is {first}" for n, first in sorted(shared.items())]
            layers = {n.split(".")[0] for n in shared} & {"encoder", "decoder"}
            hint = (
                ": every layer has its own parameters (nn.ModuleList([layer] * n) gives all n "
                "layers one layer's; build each layer anew)"
                if layers
                else ": a tied table is one tensor listed once"
            )
            raise Failure(
                f"{label}: names that are one tensor: {listing(pairs, 2)} ({len(shared)} names "
                f"share another's storage){hint}"
            )
    post, pre = set(got_all[0]), set(got_all[1])
    added = {"enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias"}
    if pre - post != added or post - pre:
        raise Failure(f"pre-LN adds {sorted(pre - post)} and drops {sorted(post - pre)}")


def names_advice(cfg: dict, missing: list[str], extra: list[str], buffers: list[str]) -> str:
    """The usual fixes for names that are not the contract's, as '; <advice>' or ''."""
    advice = []
    held = sorted(set(extra) & set(buffers))
    if held:
        kind = "is a persistent buffer" if len(held) == 1 else "are persistent buffers"
        advice.append(
            f"{listing(held)} {kind}: register with persistent=False (the state_dict holds "
            "parameters only)"
        )
    heads = {k.split(".", 1)[0] for k in set(extra) - set(held)}
    if len(heads) == 1 and missing:
        head = heads.pop() + "."
        if {k[len(head) :] for k in extra if k.startswith(head)} >= set(missing):
            advice.append(
                f"every name has the prefix '{head}' (the model sits in a wrapper module): make "
                "the contract's modules attributes of the Transformer itself"
            )
    if "out.bias" in extra:
        advice.append("the output layer has a bias: nn.Linear(d_model, tgt_vocab, bias=False)")
    finals = [
        k
        for k in extra
        if k.startswith(("encoder.norm.", "decoder.norm.", "enc_norm.", "dec_norm."))
    ]
    if finals and cfg["norm"] == "post":
        advice.append(
            "post-LN has no final norms: nn.TransformerEncoder and nn.TransformerDecoder add "
            "one when given norm=...; pass norm=None"
        )
    return "".join(f"; {a}" for a in advice)


@law(
    "test_validation",
    "bad input through every entry point raises the contract's error class; good input does not",
    timeout=20.0,
)
def check_validation(call: Call) -> None:
    # Bad input gives the contract's error class, never a silent answer.
    want: dict[str, str | None] = {
        "norm is not 'post' or 'pre'": "ValueError",
        "d_model not divisible by n_heads": "ValueError",
        "src_mask not bool": "TypeError",
        "tgt_mask not bool": "TypeError",
        "encode mask not bool": "TypeError",
        "src_mask shape differs from src": "ValueError",
        "tgt_mask shape differs from tgt_in": "ValueError",
        "batch sizes differ": "ValueError",
        "source longer than max_len": "ValueError",
        "source row with no real token": "ValueError",
        "target row with padding at bos": "ValueError",
        # every other entry point (issue 12)
        "decode: tgt_mask not bool": "TypeError",
        "decode: src_mask not bool": "TypeError",
        "decode: tgt_mask shape differs from tgt_in": "ValueError",
        "decode: src_mask shape differs from memory": "ValueError",
        "decode: src_mask of more rows than memory": "ValueError",
        "decode: batch sizes differ": "ValueError",
        "decode: target longer than max_len": "ValueError",
        "decode: source row with no real token": "ValueError",
        "init_state: src_mask not bool": "TypeError",
        "init_state: source row with no real token": "ValueError",
        "decode_step: y_prev of another batch size": "ValueError",
        "decode_step: memory of another batch size": "ValueError",
        "decode_step: past max_len": "ValueError",
        "fit: src and tgt rows differ": "ValueError",
        "translate: max_len past the model's": "ValueError",
        # good input that must not raise
        "accepted: decode_step at positions 0 .. max_len - 1": None,
        "accepted: translate with the model's max_len": None,
    }
    got = call("bad_inputs", cfg=config(n_enc=1, n_dec=1, max_len=8), seed=22)
    wrong = []
    for case, error in want.items():
        raised = got.get(case)
        if error is None:
            if raised is not None:
                wrong.append(f"{case}: raised {raised['type']}, expected no error")
        elif raised is None:
            wrong.append(f"{case}: nothing raised, expected {error}")
        elif error not in raised["bases"]:
            wrong.append(f"{case}: raised {raised['type']}, expected {error}")
    if wrong:
        raise Failure("; ".join(wrong))


@law(
    "test_defaults_are_the_contracts",
    "TransformerConfig's defaults and every contract function's defaults are the contract's, in "
    "what the functions do when an argument is left out",
    timeout=20.0,  # its work: 1.0-4.3 s in-process on impl, the examples and the real-world set
)
def check_defaults_are_the_contracts(call: Call) -> None:
    # Every other test passes every config field and argument: only this one sees a default. A
    # config's are read off one made with only the vocabularies (what a model built from it
    # gets). A function's are what it does: each is called leaving its defaulted arguments out
    # and again giving the contract's defaults, and the two must agree to the bit; a default its
    # signature states must be the contract's too, but a signature that hides one (a decorator
    # without functools.wraps) is no fault.
    want = contract_defaults()
    vocab = {"src_vocab": 11, "tgt_vocab": 13}
    got = call("defaults", functions=sorted(want["functions"]), vocab=vocab)
    wrong = []
    for name, value in want["config"].items():
        if name not in got["config"]:
            wrong.append(f"TransformerConfig: {name} has no default, expected {value!r}")
        elif got["config"][name] != value:  # 1 for 1.0 is the same default
            wrong.append(
                f"TransformerConfig: {name} defaults to {got['config'][name]!r}, expected {value!r}"
            )
    for f in sorted(want["functions"]):
        stated = got["functions"][f]
        for name, value in want["functions"][f].items():
            if name in stated and stated[name] != value:
                wrong.append(f"{f}(): {name} defaults to {stated[name]!r}, expected {value!r}")
    wrong += defaults_in_effect(call, want["functions"])
    if wrong:
        raise Failure("; ".join(wrong))


# how each function is called with its defaults left out: the parent's small model and inputs
DEFAULTS_CFG = config(n_enc=1, n_dec=1)
NOAM_CASES = [[1, 16, 4], [4, 16, 4], [9, 32, 3]]  # step, d_model, warmup: both sides of the peak
CALLED = {  # what each pair of calls leaves out
    "noam_rate": ["factor"],
    "translate": ["beam_size and length_penalty", "length_penalty (beam_size=2)"],
    "fit": ["warmup, factor, smoothing, lr, seed and callback"],
}


def defaults_in_effect(call: Call, defaults: dict[str, dict[str, Any]]) -> list[str]:
    """What each contract function does with its defaulted arguments left out, against the
    same call giving the contract's defaults: the faults found, as messages."""
    rng = np.random.default_rng(11)
    b = batch(rng, DEFAULTS_CFG, src_lens=[6, 4, 5, 3], tgt_lens=[5, 3, 4, 6])
    tgt = np.concatenate([b["tgt_in"], b["tgt_out"][:, -1:]], axis=1)
    r = call(
        "omitted_defaults",
        cfg=DEFAULTS_CFG,
        weights=pushed_weights(call, [DEFAULTS_CFG], "defaults")[0],
        data={"src": b["src"], "tgt": tgt, "pad_id": PAD},
        bos=BOS,
        eos=EOS,
        max_len=6,
        rates=NOAM_CASES,
        explicit={f: defaults[f] for f in CALLED},
    )
    wrong = []
    for f, what in CALLED.items():
        for left_out, (omitted, given, again) in zip(what, r[f], strict=True):
            if "raised" in given or "raised" in again or not same(given["value"], again["value"]):
                continue  # the call fails, or does not repeat itself: that function's tests say so
            if "raised" in omitted:
                wrong.append(
                    f"{f}() with {left_out} left out raised {omitted['raised']}: "
                    f"{omitted['message']!r} (no default in effect)"
                )
            elif not same(omitted["value"], given["value"]):
                wrong.append(
                    f"{f}() with {left_out} left out does not do what it does given the "
                    "contract's defaults: the defaults in effect are not the contract's"
                )
    return wrong


def same(a: Any, b: Any) -> bool:
    """Equal to the bit: numbers, arrays and nestings of dicts and lists of them."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    return type(a) is type(b) and (a == b or (a != a and b != b))  # nan is itself here
