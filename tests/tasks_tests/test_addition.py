"""The reversed-addition task: tokenization, the split, the tensors' shapes and determinism."""

import numpy as np
import pytest
import torch

from tasks import addition as add


def test_tokenization_round_trips_every_two_digit_sum():
    # law: decoding the target of a+b gives str(a + b); decoding the source gives "a+b"
    train, test = add.split_sums(2, n_test=100, seed=3)
    pairs = np.concatenate([train, test])
    src = add.encode_sources(pairs, 2)
    tgt = add.encode_targets(pairs, 2)
    for (a, b), s, t in zip(pairs.tolist(), src.tolist(), tgt.tolist(), strict=True):
        assert add.decode_tokens(s) == f"{a}+{b}"
        assert add.decode_answer(add.target_answer(t)) == str(a + b)
        assert s == add.encode_source(f"{a}+{b}")


def test_target_layout_is_bos_reversed_digits_eos_pad():
    tgt = add.encode_targets(np.array([[123, 456], [999, 999], [100, 100]]), 3)
    d = add.DIGIT0
    assert tgt.tolist() == [
        [add.BOS, d + 9, d + 7, d + 5, add.EOS, add.PAD],  # 579, least significant first
        [add.BOS, d + 8, d + 9, d + 9, d + 1, add.EOS],  # 1998: the longest answer fills the row
        [add.BOS, d + 0, d + 0, d + 2, add.EOS, add.PAD],
    ]


def test_vocabulary_is_shared_and_pad_is_zero():
    assert (add.PAD, add.BOS, add.EOS, add.PLUS, add.VOCAB) == (0, 1, 2, 3, 14)
    assert add.decode_tokens(range(add.VOCAB)) == "<pad><bos><eos>+0123456789"


@pytest.mark.parametrize("digits,n_test,n_train", [(1, 10, None), (2, 300, None), (3, 500, 4000)])
def test_no_held_out_sum_appears_in_training(digits, n_test, n_train):
    train, test = add.split_sums(digits, n_test, n_train, seed=7)
    assert len(test) == n_test
    sums = [tuple(sorted(p)) for p in test.tolist()]
    assert len(set(sums)) == n_test  # a+b and b+a never both held out
    seen = {tuple(sorted(p)) for p in train.tolist()}
    assert not seen & set(sums), "a held-out sum (in some order) is in training"
    if n_train is None:
        # every ordered pair is either training or (in some order) held out
        k = len(add.operand_range(digits))
        assert len(train) + sum(2 - (a == b) for a, b in sums) == k * k
    else:
        assert len(train) == n_train
    assert len({tuple(p) for p in train.tolist()}) == len(train)  # no duplicated training pair
    ops = add.operand_range(digits)
    assert train.min() >= ops.start and train.max() < ops.stop


def test_load_returns_the_contracts_tensors():
    data = add.load(3, n_test=50, n_train=200, seed=0)
    assert data.train_src.shape == (200, 7) and data.train_tgt.shape == (200, 6)
    assert data.test_src.shape == (50, 7) and data.test_tgt.shape == (50, 6)
    for t in (data.train_src, data.train_tgt, data.test_src, data.test_tgt):
        assert t.dtype == torch.long
    assert (data.pad, data.bos, data.eos, data.vocab) == (0, 1, 2, 14)
    assert (data.train_tgt[:, 0] == data.bos).all()
    assert ((data.train_tgt == data.eos).sum(1) == 1).all()


def test_split_is_deterministic_per_seed_and_differs_between_seeds():
    a = add.load(2, n_test=100, n_train=1000, seed=5)
    b = add.load(2, n_test=100, n_train=1000, seed=5)
    c = add.load(2, n_test=100, n_train=1000, seed=6)
    assert torch.equal(a.train_src, b.train_src) and torch.equal(a.test_tgt, b.test_tgt)
    assert not torch.equal(a.test_src, c.test_src)


def test_exact_match_counts_whole_answers():
    tgt = add.encode_targets(np.array([[12, 34], [50, 50]]), 2)
    right = [add.answer_tokens(46), add.answer_tokens(100)]
    assert add.exact_match(right, tgt) == 1.0
    assert add.exact_match([right[0], add.answer_tokens(10)], tgt) == 0.5  # a prefix is wrong
    assert add.exact_match([right[0], right[1] + [add.EOS]], tgt) == 0.5  # a kept eos is wrong
    assert add.exact_match([[], right[1]], tgt) == 0.5


@pytest.mark.parametrize(
    "text,message",
    [("12+345", "'12'"), ("123-456", "a sum like"), ("099+100", "'099'"), ("1a3+456", "a sum")],
)
def test_parse_sum_names_the_bad_value(text, message):
    with pytest.raises(ValueError, match=message):
        add.parse_sum(text, 3)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="digits must be a positive int"):
        add.split_sums(0, 10)
    with pytest.raises(ValueError, match="distinct 1-digit sums"):
        add.split_sums(1, 100)  # only 55 one-digit sums exist
    with pytest.raises(ValueError, match="outside the 2-digit range"):
        add.encode_sources(np.array([[5, 12]]), 2)
    with pytest.raises(ValueError, match="cannot tokenize"):
        add.encode_source("1*2")
