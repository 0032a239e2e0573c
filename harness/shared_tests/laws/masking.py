"""The masking laws, each judged by how the logits move when the inputs change: the decoder is
causal, source padding is never read, and the decoder reads the source."""

from __future__ import annotations

import numpy as np

import oracle
from harness.shared_tests.inputs import (
    PAD,
    POST,
    PRE,
    batch,
    changed,
    contract_params,
    draw_seed,
    forward_inputs,
    pushed_weights,
    tokens,
)
from harness.shared_tests.record import Call, Failure, law
from harness.shared_tests.verdicts import (
    DEPENDS,
    assert_close,
    assert_equal_bits,
    assert_holds,
    assert_within,
    both,
    computed_params,
    derived,
)


@law(
    "test_decoder_is_causal",
    "changing targets after t leaves logits 0..t bitwise equal",
    timeout=20.0,
    points=8,
)
def check_decoder_is_causal(call: Call) -> None:
    # Changing the targets after position t leaves the logits at positions 0..t bitwise equal;
    # and, anchored by the oracle, the positions after t whose logits the contract's model moves
    # must move too (a decoder that ignores its targets is not causal, it is blind). Which
    # positions move is the architecture's, not the weights': the oracle runs on weights the
    # parent draws, so the anchor never reads (or charges) the subject's own state_dict.
    rng = np.random.default_rng(2)
    for cfg, weights in zip((POST, PRE), pushed_weights(call, [POST, PRE], "causal"), strict=True):
        base = batch(rng, cfg, src_lens=[5, 3], tgt_lens=[7, 7])
        variants, cuts = [forward_inputs(base)], (0, 3, 5)
        for t in cuts:
            v = forward_inputs(base)
            variants.append({**v, "tgt_in": changed(rng, v["tgt_in"], cfg["tgt_vocab"], t + 1)})
        r = call("forward_logits", cfg=cfg, weights=weights, batches=variants)
        assert_holds(f"{cfg['norm']}-LN", r["state_dict"], weights)
        ref = r["logits"][0]
        params = contract_params(cfg, seed=draw_seed("causal anchor", cfg["norm"]))
        for i, (t, got) in enumerate(zip(cuts, r["logits"][1:], strict=True)):
            label = f"{cfg['norm']}-LN: logits at positions 0..{t} after changing the targets "
            assert_equal_bits(
                f"{label}after position {t}",
                got[:, : t + 1],
                ref[:, : t + 1],
                ("row", "position", "token"),
            )
            want = [
                oracle.forward(params, v["src"], v["tgt_in"], v["src_mask"], v["tgt_mask"])
                for v in (variants[0], variants[i + 1])
            ]
            moves = np.abs(want[1] - want[0]).max(axis=-1) > DEPENDS
            still = np.abs(np.asarray(got) - ref).max(axis=-1) <= DEPENDS
            blind = np.argwhere(moves & still & variants[0]["tgt_mask"])
            if len(blind):
                row, pos = blind[0]
                raise Failure(
                    f"{cfg['norm']}-LN: changing the targets after position {t} left the logits "
                    f"at row {row}, position {pos} unchanged where the oracle's move: the decoder "
                    "does not read its targets"
                )


@law(
    "test_source_padding_is_never_read",
    "ids at padded source positions, and extra padding, change nothing",
    timeout=20.0,
    points=8,
)
def check_source_padding_is_never_read(call: Call) -> None:
    # The ids at padded source positions, and how much padding follows, change nothing.
    rng = np.random.default_rng(3)
    for cfg, weights in zip((POST, PRE), pushed_weights(call, [POST, PRE], "padding"), strict=True):
        base = forward_inputs(batch(rng, cfg, src_lens=[6, 3, 1], tgt_lens=[5, 5, 4]))
        other_ids = base["src"].copy()
        pads = ~base["src_mask"]
        other_ids[pads] = tokens(rng, cfg["src_vocab"], (int(pads.sum()),))
        longer = np.concatenate([other_ids, tokens(rng, cfg["src_vocab"], (3, 3))], axis=1)
        longer_mask = np.concatenate([base["src_mask"], np.zeros((3, 3), bool)], axis=1)
        batches = [
            base,
            {**base, "src": other_ids},
            {**base, "src": longer, "src_mask": longer_mask},
        ]
        r = call("forward_logits", cfg=cfg, weights=weights, batches=batches)
        assert_holds(f"{cfg['norm']}-LN", r["state_dict"], weights)
        ref, same_shape, extended = r["logits"]
        mask = base["tgt_mask"]
        assert_close(
            f"{cfg['norm']}-LN: logits after changing the ids at padded source positions",
            same_shape,
            ref,
            0.0,  # the same shapes and masked keys: a correct model gives the same bits
            mask=mask,
        )
        # the same logits in another summation order (more keys, each weighted 0): each within
        # its bound of the oracle's, so within both bounds of each other
        _, bound = derived(
            oracle.forward,
            computed_params(weights, cfg),
            base["src"],
            base["tgt_in"],
            base["src_mask"],
            base["tgt_mask"],
            dtype=r["dtype"],
            rows=True,
        )
        assert_within(
            f"{cfg['norm']}-LN: logits with 3 more padded source positions",
            extended,
            ref,
            both(bound),
            r["dtype"],
            mask=mask,
        )


@law(
    "test_decoder_reads_the_source",
    "a different source changes every row's logits",
    timeout=20.0,
    points=6,
)
def check_decoder_reads_the_source(call: Call) -> None:
    # A different source changes the logits of every row.
    rng = np.random.default_rng(4)
    for cfg, weights in zip((POST, PRE), pushed_weights(call, [POST, PRE], "source"), strict=True):
        base = forward_inputs(batch(rng, cfg, src_lens=[5, 5, 3], tgt_lens=[4, 4, 4]))
        other = np.where(base["src_mask"], changed(rng, base["src"], cfg["src_vocab"], 0), PAD)
        r = call("forward_logits", cfg=cfg, weights=weights, batches=[base, {**base, "src": other}])
        assert_holds(f"{cfg['norm']}-LN", r["state_dict"], weights)
        change = np.abs(r["logits"][1] - r["logits"][0]).max(axis=(1, 2))
        for row, c in enumerate(change):
            if not c > DEPENDS:
                raise Failure(
                    f"{cfg['norm']}-LN: changing every source token of row {row} changed its "
                    f"logits by at most {c:.3g}: the decoder does not read the source"
                )
