# Attack: take the reference implementation instead of writing one. Fault: the import itself
# (and Noam counted from n = step, should it slip through).
from impl.transformer import noam_rate as _reference_noam  # noqa: F401


def noam_rate(step, d_model, warmup, factor=1.0):
    n = max(step, 1e-12)
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
