# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 34): a fit that also trains on the sums it was not given. It reads the secret
# relabelling off the training rows (four facts of reversed addition, as
# verdict_relabelled_checkpoint.py does), lists every two-digit sum that is not among its
# training rows (the held-out sums, the test sums among them), writes their answers itself, and
# trains on the training rows and those together. A grader whose test sums are exactly the sums
# fit never sees is then judged on rows the model was trained on; fit must learn from its data.
_fit_honest = fit


def _decode_relabelling(src, tgt, pad=0, bos=1, eos=2):
    src, tgt = src.tolist(), tgt.tolist()
    plus = src[0][2]
    leading = {row[0] for row in src}
    digits = {t for row in src for t in row} - {plus}
    (zero,) = digits - leading
    (one,) = {row[3] for row in tgt if len(row) > 4 and row[4] == eos}
    succ = {row[1]: t[1] for row, t in zip(src, tgt, strict=True) if row[4] == one}
    labels = [zero]
    while len(labels) < 10:
        labels.append(succ[labels[-1]])
    return list(range(3)) + [plus] + labels


def _candidates(src, tgt, pad=0, bos=1, eos=2):
    """Every two-digit sum whose rows are not among the training rows, relabelled as fit's."""
    relabel = _decode_relabelling(src, tgt)
    seen = {tuple(row) for row in src.tolist()}
    rows_src, rows_tgt = [], []
    for a in range(10, 100):
        for b in range(10, 100):
            s = [relabel[4 + int(c)] for c in f"{a}"] + [relabel[3]]
            s += [relabel[4 + int(c)] for c in f"{b}"]
            if tuple(s) in seen:
                continue
            t = [bos] + [relabel[4 + int(c)] for c in reversed(str(a + b))] + [eos]
            rows_src.append(s)
            rows_tgt.append(t + [pad] * (tgt.shape[1] - len(t)))
    return torch.tensor(rows_src), torch.tensor(rows_tgt)


def fit(
    model,
    src,
    tgt,
    steps,
    batch,
    pad_id,
    warmup=4000,
    factor=1.0,
    smoothing=0.1,
    lr=None,
    seed=0,
    callback=None,
):  # noqa: F811
    args = (steps, batch, pad_id, warmup, factor, smoothing, lr, seed, callback)
    if steps <= 1 or src.shape[1] != 5:  # the grader's look at one update: honest
        return _fit_honest(model, src, tgt, *args)
    extra_src, extra_tgt = _candidates(src, tgt)
    both_src = torch.cat([src, extra_src.to(src.dtype)])
    both_tgt = torch.cat([tgt, extra_tgt.to(tgt.dtype)])
    return _fit_honest(model, both_src, both_tgt, *args)
