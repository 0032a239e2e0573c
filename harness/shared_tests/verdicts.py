"""How the shared tests judge: each value against its own bound, derived by the oracle for the
subject's dtype; comparisons that fail on any non-finite value; and the oracle's reading of a
subject's weights."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

import oracle
from harness.shared_tests import bounds_store
from harness.shared_tests.inputs import contract_shapes, run_dtype
from harness.shared_tests.record import Failure
from oracle.precision import PRECISIONS

# How far a subject's value may be from the oracle's is derived per value, never calibrated: the
# oracle re-runs its own computation of that value under the roundings of the subject's dtype
# (oracle.roundoff, Monte Carlo arithmetic), and the bound, ten times the spread of 32 such runs,
# holds for an honest implementation computing in that dtype with probability ~1 - 1e-10 per
# value (oracle/roundoff.py argues the model and the statistics). A value that is exact in
# the oracle's arithmetic (a masked product, a sum of zeros) gets a bound of the dtype's
# subnormal size. Two honest computations of one value by the same subject (decode_step and
# decode, a source padded to another length) differ by at most the sum of their bounds: `both`.
_BOUNDS: dict[tuple, Future] = {}
_BOUNDS_LOCK = threading.Lock()
_BOUNDS_KEPT = 64  # the cache's size: every subject of a matrix shares the run's draws


def check_dtype(dtype: Any) -> None:
    """The dtype a subject says it computed in is the run's to choose, not the subject's (a
    wider dtype would widen its bounds): float64 or float32 (the float32 fallback of a model
    that cannot run in float64) by default; with --dtype that dtype, or float32 for the
    training-mode probes of a 16-bit run. Anything else is a failure to judge."""
    chosen = run_dtype()
    allowed = ("float64", "float32") if chosen is None else (chosen, "float32")
    if dtype not in allowed or dtype not in PRECISIONS:
        raise Failure(
            f"the subject reports computing in {dtype!r}; this run judges "
            f"{' or '.join(dict.fromkeys(allowed))} only"
        )


def derived(
    fn: Any, *args: Any, dtype: str, rows: bool = False, chosen: bool = False
) -> tuple[Any, Any]:
    """(value, bound): the oracle's fn(*args) and, for each of its numbers, the bound on
    |subject - oracle| of a subject that computes it in `dtype` (oracle.bounded; rows=True where
    fn's rows are independent, a forward pass: the runs then go through as one); computed once
    per function, dtype and inputs, so every subject of a run that got the same weights shares
    it. `dtype` is what the subject reports (check_dtype: the run's rule), or with chosen=True
    the parent's own choice for this test (the dtype of the inputs it gave: the hand examples'
    float64 numbers), which no run rule overrules. A dtype with no error model is a failure to
    judge, said as such."""
    if chosen:
        if dtype not in PRECISIONS:
            raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")
    else:
        check_dtype(dtype)
    h = hashlib.sha256()
    bounds_store.digest(args, h)
    key = (fn.__module__, fn.__qualname__, dtype, rows, h.digest())
    with _BOUNDS_LOCK:  # one computation per key: a second thread waits for the first's
        future, mine = _BOUNDS.get(key), False
        if future is None:
            if len(_BOUNDS) >= _BOUNDS_KEPT:
                _BOUNDS.pop(next(iter(_BOUNDS)))
            future = _BOUNDS[key] = Future()
            mine = True
    if mine:
        try:
            path = bounds_store.file_for(key, args, fn)
            result = None if path is None else bounds_store.load(path)
            if result is None:
                result = oracle.bounded(fn, *args, dtype=dtype, rows=rows)
                if path is not None:
                    bounds_store.save(path, result)
            future.set_result(result)
        except BaseException as e:
            with _BOUNDS_LOCK:
                _BOUNDS.pop(key, None)
            future.set_exception(e)
    return future.result()


def unit_roundoff(dtype: str) -> float:
    """u of the dtype a subject computed in (2^-53 for float64, 2^-24 for float32, ...)."""
    check_dtype(dtype)
    return PRECISIONS[dtype].u


def both(bound: Any) -> Any:
    """The bound on the difference of two honest computations of one value: one bound each."""
    return 2 * np.asarray(bound, dtype=np.float64)


NAMES_TEST = "test_parameter_names_follow_the_norm"


def listing(items: list[str], first: int = 4) -> str:
    """A long list said once: its first few, then how many more."""
    items = list(items)
    if len(items) <= first + 1:
        return ", ".join(items)
    return f"{', '.join(items[:first])} and {len(items) - first} more"


def _common_prefix(keys: list[str]) -> str:
    """The module path every key starts with ('transformer.' for a wrapped model), or ''."""
    heads = {k.split(".", 1)[0] for k in keys}
    if len(heads) != 1 or not all("." in k for k in keys):
        return ""
    return heads.pop() + "."


def unwrapped(state: dict[str, Any]) -> dict[str, Any]:
    """The names without the one module path above them all, if there is one and the contract's
    names are not already at the top ('transformer.encoder.0...' -> 'encoder.0...')."""
    prefix = _common_prefix(list(state))
    if not prefix or any(k.startswith(("src_emb.", "encoder.", "decoder.")) for k in state):
        return state
    return {k[len(prefix) :]: v for k, v in state.items()}


# A name of the contract's vocabulary in some layout (a table, the output layer, a layer's
# parameter, a final norm): listed where the layout has none, it is a fault of tying, depth or
# placement, never an unrelated extra that a value test may read around. Only the contract's
# whole names: a parameter of the subject's own under a layer's path ('encoder.0.extra.weight')
# is an extra like any other.
CONTRACT_WORD = re.compile(
    r"^(?:(?:src_emb|tgt_emb|out)\.weight"
    r"|(?:enc_norm|dec_norm)\.(?:weight|bias)"
    r"|(?:encoder|decoder)\.\d+\.(?:(?:self_attn|cross_attn)\.(?:q_proj|k_proj|v_proj|out_proj)"
    r"|linear1|linear2|norm1|norm2|norm3)\.(?:weight|bias))$"
)
TABLES = ("src_emb.weight", "tgt_emb.weight", "out.weight")


def readable(state: dict[str, np.ndarray], cfg: dict) -> tuple[Any, list[str]]:
    """The oracle's Params of a subject's parameters, read as leniently as the values allow, and
    what had to be forgiven: the names test charges the names; a value test judges the values.

    Forgiven: one module path above every name (a wrapper such as `transformer.`); a bias on the
    output layer, which the oracle then adds to the logits (the model's function is what it
    computes); final norms in a post-LN model, left out, so that the values tests see what they
    change; names outside the contract's vocabulary (CONTRACT_WORD), when every name it has is
    there (an extra parameter: if the model computes with it, the values show it). Anything
    else unreadable (a name missing, a table the tying does not list, a shape not the
    contract's) raises the reader's error.
    """
    try:
        return oracle.read_state_dict(state, cfg), []
    except (ValueError, KeyError, TypeError, IndexError) as first_error:
        error = first_error
    forgiven, state = [], dict(state)
    prefix = _common_prefix(list(state))
    if prefix:
        state = unwrapped(state)
        forgiven.append(f"every name under {prefix!r}")
    bias = state.pop("out.bias", None)
    if bias is not None:
        forgiven.append("a bias on the output layer")
    if cfg.get("norm") == "post":  # nn.Transformer's automatic final norms: the values judge them
        finals = [k for k in state if k.split(".norm.")[0] in ("encoder", "decoder")]
        finals += [k for k in state if k.startswith(("enc_norm.", "dec_norm."))]
        for k in finals:
            state.pop(k)
        if finals:
            forgiven.append("final norms in a post-LN model")
    try:
        params = oracle.read_state_dict(state, cfg)
    except oracle.StateDictError as e:
        if e.missing or not e.unexpected or any(CONTRACT_WORD.fullmatch(k) for k in e.unexpected):
            raise error from None
        for k in e.unexpected:
            state.pop(k, None)
        forgiven.append(f"names the contract does not have ({listing(e.unexpected)})")
        try:
            params = oracle.read_state_dict(state, cfg)
        except (ValueError, KeyError, TypeError, IndexError):
            raise error from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise error from None
    if bias is not None:
        spec = dataclasses.replace(params.spec, logits_bias=np.asarray(bias, dtype=np.float64))
        params = oracle.Params(spec, params.arrays, params.scheme)
    return params, forgiven


def read_params(state: dict[str, np.ndarray], cfg: dict, what: str = "state_dict") -> Any:
    """The oracle's Params from a subject's parameters (see `readable`); when they cannot be
    read, the test cannot judge: a Failure that names the test owning the names."""
    try:
        params, _ = readable(state, cfg)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise Failure(
            f"not judged: {NAMES_TEST} must pass first ({what} cannot be read under the "
            f"contract's names: {shorten(str(e))})"
        ) from None
    bad = sorted(k for k, v in params.arrays.items() if not np.all(np.isfinite(v)))
    if bad:
        # the oracle's expectation from NaN weights is NaN: nothing could be judged against it
        raise Failure(f"{what} holds values that are not finite: {listing(bad)}")
    return params


def untied_params(state: Any, cfg: dict, what: str) -> tuple[Any, dict[str, str]]:
    """A subject's weights read in the untied form, each table it lists once standing for those
    it is tied to (how the tables are tied is the names and embeddings tests' to charge, not the
    learning test's or a bound's); and which tables stand in for which (table -> the listed
    one)."""
    weights, stands = unwrapped(dict(state)), {}
    if "src_emb.weight" in weights and cfg["src_vocab"] == cfg["tgt_vocab"]:
        if "tgt_emb.weight" not in weights:
            weights["tgt_emb.weight"] = weights["src_emb.weight"]
            stands["tgt_emb.weight"] = "src_emb.weight"
    if "tgt_emb.weight" in weights and "out.weight" not in weights:
        weights["out.weight"] = weights["tgt_emb.weight"]
        stands["out.weight"] = stands.get("tgt_emb.weight", "tgt_emb.weight")
    return read_params(weights, {**cfg, "tie_embeddings": False}, what), stands


def computed_params(state: dict[str, np.ndarray], cfg: dict) -> Any:
    """The oracle's Params of the model a subject computes with these weights, for bounding two
    of its own computations against each other (decode_step and decode, two paddings): read as
    the config says, or, where its tables cannot be read that way (an output layer of its own
    under tie_embeddings: the names and embeddings tests' charge), in the untied form it then
    computes with. read_params's "not judged" when neither reads."""
    try:
        return read_params(state, cfg)
    except Failure as failure:
        try:
            return untied_params(state, cfg, "state_dict")[0]
        except Failure:
            raise failure from None


def gradient_params(r: dict[str, Any], cfg: dict, what: str) -> Any:
    """The oracle's Params of a probe's gradients: keyed by the state_dict's names where an
    entry is the parameter (r["grads"]), else by named_parameters name (r["by_parameter"],
    e.g. torch's stack names when the state_dict's entries are copies); read_params's "not
    judged" when neither can be read."""
    try:
        return read_params(r["grads"], cfg, what)
    except Failure as failure:
        first = failure
    if isinstance(r.get("by_parameter"), dict):
        try:
            return read_params(r["by_parameter"], cfg, what)
        except Failure:
            pass
    raise first


def table_params(state: dict[str, np.ndarray], cfg: dict, what: str = "state_dict") -> Any:
    """The oracle's Params for a test that reads only the embedding tables (and the output
    layer): `read_params` when the whole state_dict can be read; else, when the tables can be
    (under the contract's names, a wrapper's path forgiven, the contract's shapes), Params that
    hold them with every other parameter a placeholder 0, which nothing may use. When not even
    the tables can be read: read_params's "not judged"."""
    try:
        return read_params(state, cfg, what)
    except Failure as failure:
        first = failure
    state = unwrapped(dict(state))
    shapes = contract_shapes(cfg)
    tables = [k for k in shapes if k in TABLES]
    if any(k not in state or tuple(np.shape(state[k])) != shapes[k] for k in tables):
        raise first
    if any(k in state and k not in tables for k in TABLES):
        raise first  # a table the tying does not list: whose values the layers use is unknown
    filled = {
        k: np.asarray(state[k], dtype=np.float64) if k in tables else np.zeros(shape)
        for k, shape in shapes.items()
    }
    bad = [k for k in tables if not np.all(np.isfinite(filled[k]))]
    if bad:
        raise Failure(f"{what} holds values that are not finite: {listing(bad)}")
    return oracle.read_state_dict(filled, cfg)


def shorten(message: str, keep: int = 4) -> str:
    """A reader's message with each bracketed key list cut to its first few."""

    def cut(match: re.Match) -> str:
        keys = [k.strip().strip("'\"") for k in match.group(1).split(",") if k.strip()]
        return "[" + listing(keys, keep) + "]"

    return re.sub(r"\[([^\[\]]*)\]", cut, message)


def pair(got: float, want: float) -> str:
    """'got X, expected Y' with enough digits that X and Y differ when they do."""
    for digits in (8, 10, 12, 14, 17):
        a, b = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if a != b or got == want:
            break
    return f"got {a}, expected {b}"


def where(index: tuple[int | np.integer, ...], axes: tuple[str, ...]) -> str:
    return ", ".join(f"{a} {i}" for a, i in zip(axes, index, strict=False)) or "the value"


def errors(got: np.ndarray, want: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, float]:
    """|got - want| where `mask` (broadcast from the left) holds, 0 elsewhere, inf where either
    is not finite (so a NaN fails every comparison, never passes one); and the scale
    max(1, max |want|) that tolerances are relative to."""
    keep = np.ones(want.shape, dtype=bool)
    if mask is not None:
        trailing = (1,) * (want.ndim - mask.ndim)
        keep = np.broadcast_to(mask.reshape(mask.shape + trailing), want.shape)
    err = np.where(keep, np.abs(got - want), 0.0)
    err = np.where(keep & ~(np.isfinite(got) & np.isfinite(want)), np.inf, err)
    finite = np.where(keep & np.isfinite(want), np.abs(want), 0.0)
    return err, max(1.0, float(finite.max(initial=0.0)))


def assert_close(
    what: str,
    got: Any,
    want: Any,
    tol: float,
    mask: np.ndarray | None = None,
    axes: tuple[str, ...] = ("row", "position", "token"),
) -> None:
    """|got - want| <= tol * max(1, max |want|) wherever `mask` (broadcast from the left) holds."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Failure(f"{what}: shape {got.shape}, expected {want.shape}")
    err, scale = errors(got, want, mask)
    if err.max(initial=0.0) > tol * scale:
        i = np.unravel_index(int(np.argmax(err)), err.shape)
        raise Failure(
            f"{what}: max abs error {err[i]:.3g} at {where(i, axes)} ({pair(got[i], want[i])}); "
            f"tolerance {tol * scale:.3g}"
        )


def assert_within(
    what: str,
    got: Any,
    want: Any,
    bound: Any,
    dtype: str,
    mask: np.ndarray | None = None,
    axes: tuple[str, ...] = ("row", "position", "token"),
) -> None:
    """|got - want| <= bound, value by value, wherever `mask` (broadcast from the left) holds;
    the bound is `derived`'s for a subject computing in `dtype`. The failure names the value
    furthest past its own bound."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Failure(f"{what}: shape {got.shape}, expected {want.shape}")
    err, _ = errors(got, want, mask)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), want.shape)
    past = err > bound
    if past.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(past, err / bound, 0.0)
        i = np.unravel_index(int(np.argmax(np.where(np.isnan(ratio), np.inf, ratio))), err.shape)
        raise Failure(
            f"{what}: abs error {err[i]:.3g} at {where(i, axes)} ({pair(got[i], want[i])}), past "
            f"its bound {bound[i]:.3g} (derived for {dtype}); max abs error {err.max():.3g}"
        )


def assert_equal_bits(what: str, got: np.ndarray, want: np.ndarray, axes: tuple[str, ...]) -> None:
    """Bitwise equality, reporting the first differing element."""
    if got.shape != want.shape:
        raise Failure(f"{what}: shape {got.shape}, expected {want.shape}")
    if not np.array_equal(got, want):
        diff = np.abs(got - want)
        i = tuple(int(k) for k in np.argwhere(got != want)[0])
        raise Failure(
            f"{what}: not bitwise equal; first difference at {where(i, axes)} (change "
            f"{diff[i]:.3g}), largest change {diff.max():.3g}"
        )


def assert_holds(what: str, held: Any, pushed: dict[str, np.ndarray]) -> None:
    """The model holds exactly the weights the test loaded into it (every value drawn is a
    float32 number, so a float32 model holds them exactly too): a model that ignores the weights
    it is given, or alters them, computes something the oracle was not asked about."""
    if not isinstance(held, dict):
        raise Failure(f"{what}: the model's parameters could not be read back")
    missing = sorted(set(pushed) - set(held))
    if missing:
        raise Failure(
            f"{what}: after loading the test's weights the state_dict no longer lists "
            f"{listing(missing)}"
        )
    for name in sorted(pushed):
        got = np.asarray(held[name], dtype=np.float64)
        if got.shape != pushed[name].shape or not np.array_equal(got, pushed[name]):
            change = (
                f"max change {np.abs(got - pushed[name]).max():.3g}"
                if got.shape == pushed[name].shape
                else f"shape {got.shape}, loaded {pushed[name].shape}"
            )
            raise Failure(
                f"{what}: the model does not hold the weights the test loaded into it: {name} "
                f"({change}); load_state_dict must set every parameter, and a forward pass "
                "must not change them"
            )


# An honest model's logits move by O(0.1) when an input they depend on changes; 1e-6 is far above
# float64 rounding (1e-15) and float32's (1e-7 of O(1) values), so only an output that does not
# read that input stays below it.
DEPENDS = 1e-6
