# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 21): a fit that learns nothing from the data it is given: it trains on the
# addition task as published (its own copy of the data, as a checkpoint shipped with the
# submission would have been trained) and ignores the grader's rows. A grader that judges only
# the weights that come back passes it; on the grader's secret relabelling of the task, and
# against the oracle's own first Adam step, it fails.
_fit_as_published = fit


def _published_task(digits=2):
    pad, bos, eos, plus, digit0 = 0, 1, 2, 3, 4
    src, tgt = [], []
    for a in range(10**digits):
        for b in range(10**digits):
            da = [digit0 + int(c) for c in f"{a:0{digits}d}"]
            db = [digit0 + int(c) for c in f"{b:0{digits}d}"]
            src.append(da + [plus] + db)
            answer = [digit0 + int(c) for c in reversed(str(a + b))]
            row = [bos] + answer + [eos]
            tgt.append(row + [pad] * (digits + 3 - len(row)))
    return torch.tensor(src), torch.tensor(tgt)


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
    own_src, own_tgt = _published_task()
    return _fit_as_published(
        model, own_src, own_tgt, steps, batch, pad_id, warmup, factor, smoothing, lr, seed, callback
    )
