"""The interface laws: the state_dict's names and shapes, the contract's defaults, and bad input
through every entry point."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import (
    BOS,
    EOS,
    PAD,
    batch,
    config,
    contract_defaults,
    contract_shapes,
    draw_seed,
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
    for cfg, found in zip(cfgs, call("state_dict_copies", cfgs=cfgs), strict=True):
        if found["copies"]:
            label = f"{cfg['norm']}-LN, {cfg['n_enc']}+{cfg['n_dec']} layers, tie {tying(cfg)}"
            raise Failure(f"{label}: {copies_advice(found['copies'], found['unlisted'])}")
    post, pre = set(got_all[0]), set(got_all[1])
    added = {"enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias"}
    if pre - post != added or post - pre:
        raise Failure(f"pre-LN adds {sorted(pre - post)} and drops {sorted(post - pre)}")


def copies_advice(copies: list[str], unlisted: list[str]) -> str:
    """What to change where the state_dict's entries are copies of the parameters."""
    held = f" (no entry is {listing(unlisted, 3)} or a view of it)" if unlisted else ""
    return (
        f"the state_dict's {listing(copies, 3)} ({len(copies)} of its entries) are copies of "
        f"the model's parameters, not the parameters{held}: the state_dict holds exactly the "
        "named parameters, so weights loaded by its names must be the ones the optimizer "
        "updates. A state_dict hook may rename a parameter or hand out a view of one (a slice "
        "of a fused projection: w[i * d:(i + 1) * d]), never a copy (.clone(), torch.cat, "
        ".contiguous() of a strided slice); or make each of the contract's names a parameter "
        "of its own"
    )


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
    # (case, the error expected (None: none), what was raised (None: nothing))
    wrong: list[tuple[str, str | None, dict[str, Any] | None]] = []
    for case, error in want.items():
        raised = got.get(case)
        if error is None:
            if raised is not None:
                wrong.append((case, error, raised))
        elif raised is None or error not in raised["bases"]:
            wrong.append((case, error, raised))
    if wrong:
        raise Failure(wrong_cases(wrong, len(want)))


def wrong_cases(wrong: list[tuple[str, str | None, dict[str, Any] | None]], total: int) -> str:
    """test_validation's message: a headline, then per thing that happened (nothing raised; a
    class raised at the subject's line, or inside torch called from it) a line, and under it
    its cases by the error each expected, wrapped."""
    groups: dict[str, dict[str, list[str]]] = {}
    for case, expected, raised in wrong:
        group = groups.setdefault(happened(raised), {})
        group.setdefault(expected or "no error", []).append(case)
    lines = [
        f"{len(wrong)} of {total} cases wrong: bad input must raise the contract's error class, "
        "good input nothing"
    ]
    wrap = textwrap.TextWrapper(width=100, break_long_words=False, break_on_hyphens=False)
    for what, by_error in groups.items():
        wrap.initial_indent, wrap.subsequent_indent = "  ", "      "
        lines += wrap.wrap(f"{what}:")
        wrap.initial_indent = "    "
        for error, cases in by_error.items():
            lines += wrap.wrap(f"expected {error}: {'; '.join(cases)}")
    return "\n".join(lines)


def happened(raised: dict[str, Any] | None) -> str:
    """What a bad input's call raised, and where: at the subject's own line, or inside a library
    (torch) called from it, as the probe found the frames (bad_inputs)."""
    if raised is None:
        return "nothing raised"
    said = f"raised {raised['type']}"
    if raised["type"] == "NotImplementedError":  # the stub's name, or torch's missing forward
        said += f"({raised.get('message', '')!r})"
    if not raised.get("at"):
        return said
    if raised.get("yours"):
        return f"{said} at your {raised['at']}"
    inside = f"inside {raised['library']}" if raised.get("library") else "outside your code"
    called = f", called from your {raised['from']}" if raised.get("from") else ""
    return f"{said} {inside} at {raised['at']}{called}"


@law(
    "test_defaults_are_the_contracts",
    "TransformerConfig's defaults and every contract function's defaults are the contract's, in "
    "what the functions do when an argument is left out",
    timeout=20.0,  # its work: 1.0-4.3 s in-process on impl, the examples and the real-world set
)
def check_defaults_are_the_contracts(call: Call) -> None:
    # Every other test passes every config field; the laws that call noam_rate, fit and translate
    # anyway leave the arguments equal to the contract's defaults out at secret points
    # (harness.shared_tests.omitted), so a default in effect that is not the contract's fails
    # them too where it changes their result. A config's are read off one made with only the
    # vocabularies (what a model built from it gets). A function's are what it does: each is
    # called leaving its defaulted arguments out and again giving the contract's defaults, and
    # the two must agree to the bit; a default its signature states must be the contract's too,
    # but a signature that hides one (a decorator without functools.wraps) is no fault.
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


# How each function is called with its defaults left out (issue 49): on the parent's small model,
# with inputs, a number of calls, which arguments each leaves out and the calls' order all drawn
# from the run's secret, so that no history, count, calling frame or input tells the subject
# which calls are judged: every call that leaves an argument out is.
DEFAULTS_CFG = config(n_enc=1, n_dec=1)
D_MODELS = (16, 32, 64, 128, 256, 512, 1024)


def _noam_inputs(rng: np.random.Generator, n: int) -> list[list[int]]:
    """n (step, d_model, warmup) drawn on both sides of the peak."""
    return [
        [int(rng.integers(0, 2000)), int(rng.choice(D_MODELS)), int(rng.integers(1, 4001))]
        for _ in range(n)
    ]


def noam_calls(rng: np.random.Generator) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """noam_rate's inputs and calls: some inputs called both ways (a factor given, of 1.0 or
    not, and left out), some only with it left out; at least four calls leave it out."""
    both, alone = int(rng.integers(3, 6)), int(rng.integers(2, 4))
    cases = _noam_inputs(rng, both + alone)
    calls = []
    for i in range(both + alone):
        for _ in range(int(rng.integers(1, 3))):
            calls.append({"f": "noam_rate", "case": i, "kw": {}})
        if i < both:
            for _ in range(int(rng.integers(1, 3))):
                factor = float(rng.choice([1.0, 1.0, 0.5, 2.0]))
                calls.append({"f": "noam_rate", "case": i, "kw": {"factor": factor}})
    return cases, calls


def defaults_plan(
    defaults: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """This run's inputs for omitted_defaults, its calls in their order, and translate's max_len.
    translate and fit are each called first giving every default (a first call unlike the later
    ones is no fault of the defaults), then in a drawn order: each call gives its function's
    defaults or leaves a drawn set of them out (translate's beam_size given 1 to 3 where only the
    length penalty is left out), and each way of calling is also made twice giving them all (a
    control: a function that does not repeat itself is not judged here)."""
    rng = np.random.default_rng(draw_seed("defaults plan"))
    noam, calls = noam_calls(rng)
    sources, fits = [], []
    for _ in range(2):
        rows = int(rng.integers(2, 5))
        lens = rng.integers(2, 8, size=(2, rows)).tolist()
        b = batch(rng, DEFAULTS_CFG, src_lens=lens[0], tgt_lens=lens[1])
        sources.append(b["src"])
        tgt = np.concatenate([b["tgt_in"], b["tgt_out"][:, -1:]], axis=1)
        fits.append({"src": b["src"], "tgt": tgt, "pad_id": PAD})
    tr, fit = defaults["translate"], defaults["fit"]
    firsts = [
        {"f": "translate", "case": 0, "kw": dict(tr)},
        {"f": "fit", "case": 0, "kw": dict(fit)},
    ]
    for i in range(len(sources)):
        beam = int(rng.integers(1, 4))
        ways: list[tuple[dict, dict]] = [({}, dict(tr))]  # (left out, the same given)
        ways.append(({"beam_size": beam}, {**tr, "beam_size": beam}))
        ways.append(({"length_penalty": tr["length_penalty"]}, dict(tr)))
        for kw, given in ways:
            for _ in range(int(rng.integers(1, 3))):
                calls.append({"f": "translate", "case": i, "kw": kw})
            calls += [{"f": "translate", "case": i, "kw": given}] * 2
        names = sorted(fit)
        calls.append({"f": "fit", "case": i, "kw": {}})  # every argument left out once
        for _ in range(int(rng.integers(0, 2))):
            kept = [n for n in names if rng.random() < 0.5]
            if len(kept) == len(names):
                kept.pop(int(rng.integers(len(kept))))
            calls.append({"f": "fit", "case": i, "kw": {n: fit[n] for n in kept}})
        calls += [{"f": "fit", "case": i, "kw": dict(fit)}] * 2
    order = rng.permutation(len(calls))
    inputs = {"noam_rate": noam, "translate": sources, "fit": fits}
    return inputs, firsts + [calls[i] for i in order], int(rng.integers(4, 9))


def defaults_in_effect(call: Call, defaults: dict[str, dict[str, Any]]) -> list[str]:
    """What each contract function does with its defaulted arguments left out, against the
    oracle with the contract's defaults (noam_rate) or the same call giving them (translate,
    fit): the faults found, as messages. noam_rate is called once more through the hand
    example's probe, on inputs and in an order of their own."""
    inputs, calls, max_len = defaults_plan(defaults)
    r = call(
        "omitted_defaults",
        cfg=DEFAULTS_CFG,
        weights=pushed_weights(call, [DEFAULTS_CFG], "defaults")[0],
        inputs=inputs,
        bos=BOS,
        eos=EOS,
        pad_id=PAD,
        max_len=max_len,
        calls=calls,
    )
    if not isinstance(r, list) or len(r) != len(calls):
        raise Failure("the calls leaving the defaults out gave no result for each call")
    wrong: list[str] = []
    noam = [(c, got) for c, got in zip(calls, r, strict=True) if c["f"] == "noam_rate"]
    raised = [(c, got) for c, got in noam if "raised" in got and not c["kw"]]
    # noam_rate that raises given every argument too is broken, not its default: one cause, one
    # charge, its hand example's (test_hand_example_noam)
    broken = any("raised" in got and c["kw"] for c, got in noam)
    if broken:
        pass
    elif raised:
        c, got = raised[0]
        wrong.append(
            f"noam_rate() with factor left out raised {got['raised']}: {got['message']!r} (no "
            "default in effect)"
        )
    else:
        wrong += noam_wrong(inputs["noam_rate"], [c for c, _ in noam], [g for _, g in noam])
    if not wrong and not broken:  # once more on inputs of its own, through the hand example's probe
        cases, more = noam_calls(np.random.default_rng(draw_seed("defaults noam")))
        listed = [cases[c["case"]] + ([c["kw"]["factor"]] if c["kw"] else []) for c in more]
        rates = call("noam_rates", cases=listed)
        if not isinstance(rates, list) or len(rates) != len(listed):
            raise Failure("noam_rate's calls gave no rate for each call")
        wrong += noam_wrong(cases, more, [{"value": x} for x in rates])
    for f in ("translate", "fit"):
        wrong += called_alike(f, defaults[f], calls, r)
    return wrong


def noam_wrong(cases: list, calls: list[dict], results: list[dict]) -> list[str]:
    """noam_rate's calls against the oracle: a message for those leaving `factor` out that miss
    the contract's rate, where every call giving it is right (else the hand example's test
    charges the formula)."""
    checked = []
    for c, got in zip(calls, results, strict=True):
        step, d, w = cases[c["case"]]
        want = oracle.noam_rate(step, d, w, c["kw"].get("factor", 1.0))
        value = got.get("value") if isinstance(got, dict) else None
        ok = isinstance(value, float) and math.isclose(value, want, rel_tol=1e-12)
        checked.append((bool(c["kw"]), ok, (step, d, w), value, want))
    if not all(ok for given, ok, *_ in checked if given):
        return []
    off = [x for x in checked if not x[0] and not x[1]]
    if not off:
        return []
    _, _, (step, d, w), rate, want = off[0]
    ratio = f" ({rate / want:.4g} times it)" if isinstance(rate, float) else ""
    left = sum(1 for given, *_ in checked if not given)
    return [
        f"noam_rate(step={step}, d_model={d}, warmup={w}) with factor left out = {rate!r}, "
        f"expected {want!r}{ratio}, the rate at the contract's factor=1.0 ({len(off)} of {left} "
        "calls leaving it out were off): the default in effect is not the contract's"
    ]


def called_alike(
    f: str, defaults: dict[str, Any], calls: list[dict], results: list[dict]
) -> list[str]:
    """f's calls leaving defaults out against the calls giving them, by input and by what the
    given arguments make of the rest: a message for the first that differs or raises, where
    every call giving them agrees with the others (else f's own tests say so)."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for c, got in zip(calls, results, strict=True):
        if c["f"] == f:
            key = (c["case"], tuple(sorted((k, repr(v)) for k, v in c["kw"].items())))
            groups.setdefault(key, []).append((c, got))
    full = set(defaults)
    wrong = []
    for (case, _), members in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        given = dict(members[0][0]["kw"])
        if set(given) != full:
            continue  # the calls leaving some out: judged against the group giving them all
        for (case2, _), others in groups.items():
            left = sorted(full - set(others[0][0]["kw"]))
            same_rest = all(given[k] == v for k, v in others[0][0]["kw"].items())
            defaulted = all(given[k] == defaults[k] for k in left)
            if case2 != case or not left or not same_rest or not defaulted:
                continue
            controls = [g for _, g in members]
            if any("raised" in g for g in controls) or not all(
                same(g["value"], controls[0]["value"]) for g in controls
            ):
                continue  # the call fails, or does not repeat itself: f's tests say so
            left = [k for k in defaults if k in left]  # in the contract's order
            said = ", ".join(left[:-1]) + " and " + left[-1] if len(left) > 1 else left[0]
            what = f"{f}() with {said} left out"
            if others[0][0]["kw"]:
                shown = ", ".join(f"{k}={v!r}" for k, v in sorted(others[0][0]["kw"].items()))
                what += f" ({shown} given)"
            for _, got in others:
                if "raised" in got:
                    wrong.append(
                        f"{what} raised {got['raised']}: {got['message']!r} (no default in effect)"
                    )
                    break
                if not same(got["value"], controls[0]["value"]):
                    wrong.append(
                        f"{what} does not do what it does given the contract's defaults: the "
                        "defaults in effect are not the contract's"
                    )
                    break
    return wrong[:1]


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
