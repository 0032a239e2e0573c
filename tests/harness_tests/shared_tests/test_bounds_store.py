"""The self-check's store of the oracle's bounds (harness.shared_tests.bounds_store): what comes
back from disk is what was derived, structure and types alike; what cannot be kept or read is
derived afresh; nothing is kept outside `kept()`."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
from harness.shared_tests import bounds_store, verdicts
from harness.shared_tests.inputs import contract_shapes, draw_weights
from harness.shared_tests.verdicts import derived, read_params

CFG = {
    "src_vocab": 7, "tgt_vocab": 7, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_enc": 1,
    "n_dec": 1, "dropout": 0.0, "norm": "post", "tie_embeddings": False, "max_len": 8,
    "ln_eps": 1e-5,
}  # fmt: skip


def same(a, b) -> bool:
    """Equal values of the same types all the way down (tuple is not list, np.float64 not float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def test_values_come_back_with_their_structure_and_types(tmp_path):
    value = (
        (np.float64(0.25), np.arange(6.0).reshape(2, 3)),
        [1.5, 3, True, None, "x", np.int64(4), np.float32(2.5)],
        {"w": np.ones((2, 2), dtype=np.float32), "b": (np.zeros(0),)},
        {3: [np.arange(3)], 5: []},  # the beam test's rows by eos
        ([((4, 2), -1.5, None)], float("inf")),  # a search: hypotheses' fields, its gap
    )
    path = tmp_path / "v.npz"
    bounds_store.save(path, value)
    assert same(bounds_store.load(path), value)


def test_what_cannot_be_kept_is_not_written(tmp_path):
    path = tmp_path / "v.npz"
    bounds_store.save(path, (np.ones(2), object()))
    bounds_store.save(tmp_path / "w.npz", {(1, 2): np.ones(2)})  # a key neither str nor int
    bounds_store.save(tmp_path / "s.npz", np.array(["a"]))  # not a number
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", [b"", b"not an archive", None])
def test_a_file_that_cannot_be_read_is_none(tmp_path, damage):
    path = tmp_path / "v.npz"
    bounds_store.save(path, (np.ones(3), 2.0))
    if damage is None:  # an archive without its tree
        np.savez(path, np.ones(3))
    else:
        path.write_bytes(damage)
    assert bounds_store.load(path) is None


def test_only_arguments_digested_whole_are_keyed(tmp_path):
    with bounds_store.kept(tmp_path):
        keyed = (np.ones(2), 1.0, [np.zeros(1)], None, {"a": np.ones(2), 3: (1, 2.0)})
        assert bounds_store.file_for(("k",), keyed, same) is not None
        assert bounds_store.file_for(("k",), (object(),), same) is None  # digested by repr
        assert bounds_store.file_for(("k",), ({(1, 2): 3},), same) is None  # a tuple as a key
    assert bounds_store.file_for(("k",), (np.ones(2),), same) is None  # outside kept(): nowhere


def test_derived_is_read_back_from_disk_in_a_later_process(tmp_path, monkeypatch):
    weights = draw_weights({k: list(v) for k, v in contract_shapes(CFG).items()}, CFG, seed=5)
    params = read_params(weights, CFG)
    src = np.array([[3, 4, 5, 0]])
    tgt = np.array([[1, 4, 6]])
    args = (params, src, tgt, src != 0, tgt != 0)
    with bounds_store.kept(tmp_path):
        first = derived(oracle.forward, *args, dtype="float32", rows=True)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    verdicts._BOUNDS.clear()  # a later process: nothing in memory

    def never(*a, **k):
        raise AssertionError("derived again where the store holds it")

    monkeypatch.setattr(oracle, "bounded", never)
    with bounds_store.kept(tmp_path):
        again = derived(oracle.forward, *args, dtype="float32", rows=True)
    assert same(again, first)
    verdicts._BOUNDS.clear()
    with pytest.raises(AssertionError, match="derived again"):  # another dtype is another key
        with bounds_store.kept(tmp_path):
            derived(oracle.forward, *args, dtype="float64", rows=True)
    verdicts._BOUNDS.clear()


def test_remembered_is_read_back_within_kept_and_only_computed_outside(tmp_path):
    calls: list[int] = []

    def doubled(x: np.ndarray, times: int) -> dict[str, np.ndarray]:
        calls.append(times)
        return {"a": x * times}

    with bounds_store.kept(tmp_path):
        first = bounds_store.remembered(doubled, np.ones(2), 2)
        again = bounds_store.remembered(doubled, np.ones(2), 2)
        other = bounds_store.remembered(doubled, np.ones(2), 3)  # other arguments, other file
    assert calls == [2, 3] and same(first, again) and other["a"].tolist() == [3.0, 3.0]
    bounds_store.remembered(doubled, np.ones(2), 2)  # outside kept(): computed, nothing read
    assert calls == [2, 3, 2] and len(list(tmp_path.glob("*.npz"))) == 2
