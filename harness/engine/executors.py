"""Which executor a run uses: the local one (harness.engine.work), or the Dask one
(harness.engine.cluster) when a --scheduler is given.

The choice sits above both implementations, so neither imports the other; the cluster module
(and with it dask) is imported inside `executor`, only for a --scheduler run, so the default
paths never load dask (tests/harness_tests/test_architecture.py checks both).
"""

from __future__ import annotations

from harness.engine.work import ClusterProblem, Executor, LocalExecutor, Scheduler


def executor(where: Scheduler | None, jobs: int | None = None) -> Executor:
    """The local executor, or a Dask one on `where` (the [dist] extra)."""
    if where is None:
        return LocalExecutor(jobs)
    try:
        from harness.engine import cluster
    except ImportError as e:
        raise ClusterProblem(
            f"--scheduler needs dask.distributed ({e}): pip install 'xfmr-oracle[dist]'"
        ) from None
    return cluster.DaskExecutor.connect(where)
