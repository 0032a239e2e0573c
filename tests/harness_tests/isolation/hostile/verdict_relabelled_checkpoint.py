# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 34): a fit whose own training is never used. It takes one honest update (so its
# first step is Adam's on the grader's batch), then reads the secret relabelling off the training
# rows it was given (four facts of reversed addition: '+' is the middle source token, the token
# never leading an operand is 0, the leading digit of a three-digit answer is 1, and adding 1 to
# a units digit gives its successor), permutes the embedding rows of a checkpoint trained on the
# task as published (made here, as a shipped file would have been) to match, loads it, and goes
# on training from there. A grader that judges only the weights it is shown passes it at the
# first checkpoint; a replay of the updates sees weights no Adam step made.
import copy as _copy

_fit_honest = fit


def _decode_relabelling(src, tgt, pad=0, bos=1, eos=2):
    """relabel[t] for published token t (3: '+', 4 + k: digit k), read off the training rows."""
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
    relabel = list(range(3)) + [plus] + labels
    return relabel


def _published(digits=2):
    pad, bos, eos, plus, digit0 = 0, 1, 2, 3, 4
    src, tgt = [], []
    lo = 10 ** (digits - 1)
    for a in range(lo, 10**digits):
        for b in range(lo, 10**digits):
            da = [digit0 + int(c) for c in f"{a:0{digits}d}"]
            db = [digit0 + int(c) for c in f"{b:0{digits}d}"]
            src.append(da + [plus] + db)
            row = [bos] + [digit0 + int(c) for c in reversed(str(a + b))] + [eos]
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
    args = (batch, pad_id, warmup, factor, smoothing, lr, seed)
    if steps <= 1:  # the grader's look at one update: honest
        return _fit_honest(model, src, tgt, steps, *args, callback)
    losses = _fit_honest(model, src, tgt, 1, *args, None)
    relabel = torch.tensor(_decode_relabelling(src, tgt))
    shipped = Transformer(_copy.deepcopy(model.cfg))
    own_src, own_tgt = _published()
    _fit_honest(shipped, own_src, own_tgt, 600, batch, pad_id, warmup, factor, smoothing, lr, 1)
    state = shipped.state_dict()
    vocab = len(relabel)
    for name, t in state.items():
        if t.dim() >= 1 and t.shape[0] == vocab and t.is_floating_point():
            moved = t.clone()
            moved[relabel] = t
            state[name] = moved
    model.load_state_dict(state)
    if callback is not None:
        callback(0, lr, losses[0])

    def later(step, rate, loss):
        if callback is not None:
            callback(step + 1, rate, loss)

    return losses + _fit_honest(model, src, tgt, steps - 1, *args, later)
