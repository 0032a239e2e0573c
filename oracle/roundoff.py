"""The rounding model, in one place: any oracle function re-run under a dtype's roundings.

`bounded(fn, *args, dtype=...)` calls fn(*args) once as it is (the oracle's value) and `samples`
more times with every floating-point result inside it rounded as an honest implementation
computing in `dtype` may round it, and returns the value with a bound on |subject - oracle| for
each of its numbers: the logits and every traced boundary (oracle.error_bounds.forward_bounds), a
loss, every parameter's gradient, a decode step's logits, whatever fn returns. Every bound the
project derives comes from here.

The model of an honest implementation (Higham, "Accuracy and Stability", ch. 2-3; each dtype's
u, u_acc and eta in oracle/precision.py):
- every stored result y moves by u|y| + eta;
- a sum or difference a + b moves first by u(|a| + |b|), its operands' roundings at their own
  magnitudes, then by its own storage: where a + b cancels, u|a + b| alone misses them (a correct
  float64 x0 of 0.056 failed such a bound by one ulp of its terms, issue 35); this covers the
  embedding + PE sum, residuals, bias adds, LayerNorm's mean subtraction, softmax's max shift and
  the loss's terms;
- a length-n reduction (matmul's inner products, sums, means, an embedding gradient's
  scatter-add) accumulates in u_acc: sum_k d_k S_k (S_k its partial sums, |d_k| <= u_acc), at
  most u_acc sqrt(n) sum|t| in the sub-Gaussian scale of Higham & Mary;
- exp, log, sqrt, tanh, sin and cos are within 2 u_acc of the exact value before they are stored;
- inputs: a weight that is not a number of the dtype is rounded when loaded (the shared tests
  draw float32 numbers, exact in float32 and float64); the positional table is the oracle's
  moved by as much as an honest table computed in u_acc may be (precision.pe_error), one random
  sign per entry;
- the oracle's own float64 rounding is counted too (u + 2^-53 everywhere). Not modelled: float16
  overflow past 65504 (the bound is inf where a value nears the dtype's largest number).

Propagation, and the choice argued: the worst-case form (Higham's gamma_n = n u on |A||B|,
carried through every equation by |W| |de|) holds for every rounding, but its componentwise
propagation grows by the row sums of |W| (0.8 sqrt(d) for N(0, 1/d) weights) at every matmul:
through a 2 + 1 layer post-LN model of width 32 it grew to 1e8 times the logits, useless beyond
one layer. Real errors propagate through W with their signs and mostly cancel. So the bound is
probabilistic, after Higham & Mary (2019): rounding errors are taken as mean-independent (round
to nearest on data that is not adversarial), and the analysis is run as a stochastic one, Monte
Carlo arithmetic (Parker, 1997): every rounding of the model is replaced by its largest size
times a random sign (storage: +-u|y|, three times round-to-nearest's variance u^2/3;
accumulations: N(0, 1) u_acc sqrt(n) sum|t|). The spread s of a value over the runs estimates
the standard deviation of a linear combination of independent bounded errors, whose tail
Hoeffding's inequality bounds: P(|err| > lam s) <= 2 exp(-lam^2 / 2). With s estimated from
K = 32 runs, err / s follows Student's t with 32 degrees of freedom, and B = LAMBDA s = 10 s is
exceeded with probability ~1e-10 per value. The runs are the equations themselves, not a
linearization, so bfloat16's percent-size errors through softmax and LayerNorm are carried as
they are.

How: verificarlo and CADNA do Monte Carlo arithmetic by compiling the program; here it is done at
numpy's dispatch. The oracle's arrays are wrapped in `Noisy`, an ndarray subclass whose
`__array_ufunc__` perturbs every floating-point result and whose `__array_function__` keeps
results wrapped through numpy's functions that only move or select (where, concatenate,
take_along_axis). The oracle's own code runs unchanged, forward and backward: one mechanism for
every value, nothing written twice. Exact operations stay exact: max, min, comparisons,
negation, abs, relu's maximum and the integer arithmetic of ids and masks.
tests/oracle_tests/perturbed_forward.py writes the same model out by hand for the forward pass,
as an independent check (test_roundoff.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from oracle.params import Params
from oracle.precision import PRECISIONS, U64, pe_error, representable

SAMPLES = 32  # K, the perturbed runs
LAMBDA = 10.0  # B = LAMBDA * s: P(|t_32| > 10) ~ 1e-10 per value

# ufuncs whose result is rounded once when stored
STORED = {
    np.add,
    np.subtract,
    np.multiply,
    np.divide,
    np.true_divide,
    np.power,
    np.square,
    np.reciprocal,
    np.float_power,
}
# ufuncs whose library implementation is within 2 u_acc before the store
TRANSCENDENTAL = {
    np.exp,
    np.expm1,
    np.log,
    np.log1p,
    np.sqrt,
    np.tanh,
    np.sin,
    np.cos,
    np.exp2,
    np.log2,
}


class _Arithmetic:
    """The roundings of one perturbed run: the dtype's unit roundoffs (plus the oracle's own
    2^-53, the bound being on |subject - oracle|), with random signs and normals drawn from one
    generator in blocks (a draw per operation would cost more than the operation)."""

    BLOCK = 1 << 16

    def __init__(self, dtype: str, rng: np.random.Generator) -> None:
        p = PRECISIONS[dtype]
        self.dtype = dtype
        self.u, self.u_acc, self.eta = p.u + U64, p.u_acc + U64, p.eta
        self.rng = rng
        self._factors: dict[float, np.ndarray] = {}
        self._normals = np.empty(0)
        self._signs: np.ndarray = np.empty(0)

    def store(self, y: np.ndarray, rel: float) -> None:
        """y (float, in place) + s (rel |y| + eta), s = +-1 per element, as y (1 + s' rel): s' = s
        sign(y) is a random sign too, and +-inf (a masked score) stays itself. eta, half the
        dtype's smallest subnormal, is added where it can matter (float16's 3e-8); below 1e-30 it
        is left out (float32's 7e-46 moves no value a test compares)."""
        factors = self._factors.get(rel, np.empty(0))
        if len(factors) < y.size:
            signs = self.rng.integers(0, 2, size=max(y.size, self.BLOCK)) * 2.0 - 1.0
            factors = 1.0 + rel * signs
        y *= factors[: y.size].reshape(y.shape)
        self._factors[rel] = factors[y.size :]
        if self.eta > 1e-30:
            y += self.eta * (self.rng.integers(0, 2, size=y.shape) * 2.0 - 1.0)

    def signs(self, size: int) -> np.ndarray:
        """`size` random signs +-1 (from a block drawn ahead)."""
        if len(self._signs) < size:
            self._signs = self.rng.integers(0, 2, size=max(size, self.BLOCK)) * 2.0 - 1.0
        out, self._signs = self._signs[:size], self._signs[size:]
        return out

    def operands(self, y: np.ndarray, spread: np.ndarray) -> None:
        """y (in place) + s u spread, spread = |a| + |b| of a sum's operands (capped, so that a
        masked -inf stays itself), one sign per element; y's non-finite values stay."""
        error = np.minimum(np.broadcast_to(spread, y.shape), _FINITE) * self.u
        error *= self.signs(y.size).reshape(y.shape)
        y += np.where(np.isfinite(y), error, 0.0)

    def accumulate(self, y: np.ndarray, n: float, abs_sum: np.ndarray) -> None:
        """y (in place) plus a length-n reduction's error, u_acc sqrt(n) sum|t| times N(0, 1)."""
        size = np.size(abs_sum)
        if len(self._normals) < size:
            self._normals = self.rng.standard_normal(max(size, self.BLOCK))
        error = np.minimum(abs_sum, _FINITE)
        error *= self._normals[:size].reshape(np.shape(abs_sum))
        self._normals = self._normals[size:]
        error *= self.u_acc * math.sqrt(n)
        y += error


_FINITE = 1e300  # |y| capped here before it scales a rounding: inf + a finite error stays inf


class _Active(threading.local):
    """The run whose roundings apply, per thread: threads that derive bounds at once (a
    matrix's subjects) each round with their own."""

    run: _Arithmetic | None = None


_ACTIVE = _Active()


def _plain(x: Any) -> Any:
    if isinstance(x, Noisy):
        return x.view(np.ndarray)
    if isinstance(x, (tuple, list)):
        return type(x)(_plain(v) for v in x)
    return x


def _wrap(x: Any) -> Any:
    if type(x) is np.ndarray and x.dtype.kind == "f":
        return x.view(Noisy)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _floating(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.floating) and np.asarray(x).dtype.kind == "f"


_ROUNDING = STORED | TRANSCENDENTAL | {np.matmul}


_SUMS = (np.add, np.subtract)


def _rounded(
    run: _Arithmetic,
    ufunc: np.ufunc,
    method: str,
    plain: list,
    kwargs: dict,
    target: Any,
    spread: Any = None,
) -> Any:
    """The rounding of one operation's result `target` (in place where it is an array);
    `spread`, a sum's |a| + |b| taken before it ran (an in-place sum overwrites a)."""
    if method == "__call__":
        target = _in_place(target)
        if spread is not None:
            run.operands(target, spread)
            run.store(target, run.u)
        elif ufunc is np.matmul:
            A, B = plain
            run.accumulate(target, np.shape(A)[-1], np.abs(A) @ np.abs(B))
            run.store(target, run.u)
        elif ufunc in STORED:
            run.store(target, run.u)
        else:
            run.store(target, run.u + 2 * run.u_acc)
    elif method == "reduce" and ufunc is np.add:
        x = plain[0]
        axis, keep = kwargs.get("axis", 0), kwargs.get("keepdims", False)
        n = x.size / max(np.size(target), 1)
        abs_sum = np.add.reduce(np.abs(x), axis=axis, keepdims=keep)
        target = _in_place(target)
        run.accumulate(target, n, abs_sum)
        run.store(target, run.u)
    elif method == "at" and ufunc is np.add:
        table, index, values = plain[0], plain[1], plain[2]
        abs_sum = np.zeros_like(table)
        np.add.at(abs_sum, index, np.abs(values))
        count = np.zeros(table.shape[:1])
        np.add.at(count, np.asarray(index).reshape(-1), 1.0)
        n = np.maximum(count, 1.0).reshape((-1,) + (1,) * (table.ndim - 1))
        table += run.rng.standard_normal(table.shape) * run.u_acc * np.sqrt(n) * abs_sum
        run.store(table, run.u)
    return target


class Noisy(np.ndarray):
    """A float64 array whose arithmetic rounds as the active run's dtype does (see the module)."""

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Noisy) else o for o in out)
        plain = [x.view(np.ndarray) if isinstance(x, Noisy) else x for x in inputs]
        run = _ACTIVE.run
        spread = None
        if run is not None and method == "__call__" and ufunc in _SUMS and len(plain) == 2:
            spread = np.abs(plain[0]) + np.abs(plain[1])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if run is not None and (method != "__call__" or ufunc in _ROUNDING):
            if method == "at":
                target = plain[0]
            else:
                target = kwargs["out"][0] if out is not None else result
            if _floating(target):
                target = _rounded(run, ufunc, method, plain, kwargs, target, spread)
                if out is None and method != "at":
                    result = target
        if isinstance(result, np.ndarray):
            return result.view(Noisy) if result.dtype.kind == "f" else result
        return _wrap(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # numpy's own implementation, on these arrays (a sum reaches __array_ufunc__ as a
        # reduce); results that came back plain are wrapped again (where, concatenate, ...)
        result = super().__array_function__(func, types, args, kwargs)
        return _wrap(result)


def _in_place(y: Any) -> np.ndarray:
    """y as a writable float ndarray (a scalar result becomes a 0-d array)."""
    return y if isinstance(y, np.ndarray) else np.asarray(y, dtype=np.float64).copy()


@contextlib.contextmanager
def _rounding(dtype: str, rng: np.random.Generator) -> Iterator[None]:
    outer, _ACTIVE.run = _ACTIVE.run, _Arithmetic(dtype, rng)
    try:
        yield
    finally:
        _ACTIVE.run = outer


def _noisy_input(x: Any, dtype: str, rng: np.random.Generator) -> Any:
    """An argument as the subject holds it: Params and float arrays rounded (+-u|w|) where
    they are not numbers of `dtype`, and wrapped so that the oracle's arithmetic on them rounds;
    anything else (ids, masks, numbers) as it is."""
    if isinstance(x, Params):
        arrays = {name: _noisy_input(w, dtype, rng) for name, w in x.arrays.items()}
        spec = x.spec
        if spec.pos_table is None:  # the sinusoid as an honest subject computes it
            pe = x.pe(spec.max_len)
            size = pe_error(pe.shape[0], pe.shape[1], PRECISIONS[dtype].u_acc + U64)
            sign = rng.integers(0, 2, size=pe.shape) * 2.0 - 1.0
            spec = dataclasses.replace(spec, pos_table=pe + sign * size)
        return Params(spec, arrays, x.scheme)
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        w = np.asarray(x, dtype=np.float64)
        p = PRECISIONS[dtype]
        size = np.where(representable(w, dtype), 0.0, (p.u + U64) * np.abs(w) + p.eta)
        sign = rng.integers(0, 2, size=w.shape) * 2.0 - 1.0
        return (w + sign * size).view(Noisy)
    return x


def _leaves(x: Any) -> list[Any]:
    """The numbers fn returned, in a fixed order: floats and float arrays of any nesting of
    tuples, lists and dicts (by key order)."""
    if isinstance(x, dict):
        return [leaf for k in x for leaf in _leaves(x[k])]
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in _leaves(v)]
    if isinstance(x, (float, np.floating)) or (isinstance(x, np.ndarray) and x.dtype.kind == "f"):
        return [np.asarray(x, dtype=np.float64).view(np.ndarray)]
    return []


def _rebuild(x: Any, leaves: Iterator[np.ndarray]) -> Any:
    if isinstance(x, dict):
        return {k: _rebuild(v, leaves) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_rebuild(v, leaves) for v in x)
    if isinstance(x, (float, np.floating)) or (isinstance(x, np.ndarray) and x.dtype.kind == "f"):
        leaf = next(leaves)
        return float(leaf) if leaf.ndim == 0 else leaf
    return None


def _tiled(x: Any, k: int) -> Any:
    """An argument with its rows (axis 0) repeated k times: arrays, and lists of arrays."""
    if isinstance(x, np.ndarray):
        return np.concatenate([x] * k, axis=0)
    if isinstance(x, list):
        return [_tiled(v, k) for v in x]
    return x


def _weights_exact(args: tuple, dtype: str) -> bool:
    """Whether every weight among the arguments is a number of `dtype` (held exactly)."""
    return all(
        bool(np.all(representable(w, dtype)))
        for x in args
        if isinstance(x, Params)
        for w in x.arrays.values()
    )


def bounded(
    fn: Callable[..., Any],
    *args: Any,
    dtype: str,
    samples: int = SAMPLES,
    seed: int = 0,
    rows: bool = False,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """(value, bound): fn(*args, **kwargs) as the oracle computes it, and for each of its numbers
    (the same structure; None for what is not a number) the bound on |subject - oracle| of a
    subject computing fn in `dtype` from the same inputs: Params and float arrays among the
    arguments are the subject's inputs. inf where a value nears the dtype's largest number.

    rows=True says that fn treats the rows (axis 0) of its array arguments independently, row i
    of every output depending on row i of the inputs only (a forward pass, a decode step; not
    a loss, which averages over rows, nor a gradient, which sums over them). Then the `samples`
    runs go through as one, every array argument's rows repeated `samples` times: the same
    roundings, drawn independently per element, at a `samples`-th of the dispatch cost. Where a
    weight is not a number of the dtype (its rounding is one draw per run, shared by the rows),
    the runs go one by one as without it."""
    if dtype not in PRECISIONS:
        raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")
    for x in args:
        if isinstance(x, Params) and x.dtype != np.float64:
            raise TypeError(f"bounds are derived for the float64 oracle, got {x.dtype}")
    value = fn(*args, **kwargs)
    want = _leaves(value)
    squares = [np.zeros_like(v) for v in want]
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if rows and _weights_exact(args, dtype):
            with _rounding(dtype, rng):
                inputs = [_noisy_input(_tiled(x, samples), dtype, rng) for x in args]
                got = _leaves(fn(*inputs, **kwargs))
            for acc, g, w in zip(squares, got, want, strict=True):
                acc += ((g.reshape(samples, *w.shape) - w) ** 2).sum(axis=0)
        else:
            for _ in range(samples):
                with _rounding(dtype, rng):
                    inputs = [_noisy_input(x, dtype, rng) for x in args]
                    got = _leaves(fn(*inputs, **kwargs))
                for acc, g, w in zip(squares, got, want, strict=True):
                    acc += (g - w) ** 2
    largest = PRECISIONS[dtype].largest
    bounds = []
    for acc, w in zip(squares, want, strict=True):
        b = LAMBDA * np.sqrt(acc / samples)
        if np.abs(w).max(initial=0.0) > largest / 2:
            b = np.full_like(b, np.inf)
        bounds.append(b)
    return value, _rebuild(value, iter(bounds))
