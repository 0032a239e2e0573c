"""The Dask executor: units of work (harness.engine.work) run on a Dask `distributed` cluster.

Imported only when a job is given --scheduler (harness.engine.executors imports it then), so
nothing of dask is imported otherwise; `pip install 'xfmr-oracle[dist]'` brings it.

What travels to a Dask worker is a unit's plain data (source text and bytes, test names, limits)
and a reference to the project's own task function; what comes back is plain data. On the Dask
worker the task runs the project's trusted code, which starts the untrusted code only as it does
here: in a bubblewrap sandbox of its own on that machine (harness.isolation), never inside the
Dask worker process. Verdicts are reached by the same trusted checks, on the worker, against the
oracle. Two refusals keep this honest (fail closed, the whole run stops with a clear error):

- a worker whose copy of the project or of its numerical libraries differs from the client's
  (harness.engine.fingerprint.project) refuses every unit: it would judge by other rules;
- a worker that cannot set up the sandbox refuses every unit that runs untrusted code, rather
  than run it uncaged.

A Dask worker that dies mid-unit is replaced by Dask itself: the scheduler gives the unit to
another worker (distributed.scheduler.allowed-failures times, 3 by default); a unit that still
cannot finish is that unit's loss (its cells are errors, its grade a grader error, with the
reason), never the batch's. A unit whose task raised is retried RETRIES times, then lost alike.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster, as_completed
from distributed.scheduler import KilledWorker

from harness.engine import fingerprint
from harness.engine.work import ClusterProblem, Scheduler, Unit

RETRIES = 1  # a unit whose task raised runs once more (elsewhere if the scheduler likes)
CONNECT_TIMEOUT = "30s"


class WorkerMismatch(RuntimeError):
    """This Dask worker's project or libraries differ from the client's."""


class NoSandbox(RuntimeError):
    """This Dask worker cannot set up the sandbox untrusted code needs."""


def remote(task: Callable[[Any], Any], payload: Any, project: str, sandboxed: bool) -> Any:
    """What runs on the Dask worker: the checks above, then the unit's own task."""
    here = fingerprint.project()
    if here != project:
        raise WorkerMismatch(
            f"worker {os.uname().nodename} runs a different project or library version "
            f"({here[:12]} here, {project[:12]} on the client; {fingerprint.versions()})"
        )
    if sandboxed:
        from harness.isolation.sandbox import SandboxUnavailable, check

        try:
            check()
        except SandboxUnavailable as e:
            where = os.uname().nodename
            raise NoSandbox(f"worker {where} cannot set up the sandbox: {e}") from None
    return task(payload)


class DaskExecutor:
    """Units as Dask tasks on a cluster: an existing scheduler's, or a LocalCluster's."""

    def __init__(self, client: Client, cluster: LocalCluster | None, description: str) -> None:
        self.client, self.cluster, self.description = client, cluster, description
        workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
        self.width = max(1, sum(w.get("nthreads", 1) for w in workers))  # units at once

    @classmethod
    def connect(cls, where: Scheduler) -> DaskExecutor:
        try:
            if where.local_workers is not None:
                n = where.local_workers
                cluster = LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
                return cls(Client(cluster), cluster, f"Dask LocalCluster of {n} workers")
            client = Client(where.address, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            raise ClusterProblem(f"cannot reach the Dask scheduler {where}: {e}") from None
        workers = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        return cls(client, None, f"Dask scheduler {where} ({workers} workers)")

    def run(self, units: Sequence[Unit], done: Callable[[int, Any], None] | None = None) -> list:
        project = fingerprint.project()
        futures = {}
        for i, unit in enumerate(units):
            future = self.client.submit(
                remote,
                unit.task,
                unit.payload(),
                project,
                unit.sandboxed,
                key=f"xfmr-{unit.label}-{os.urandom(6).hex()}",
                pure=False,
                retries=RETRIES,
            )
            futures[future] = i
        results: list[Any] = [None] * len(units)
        try:
            for future in as_completed(futures):
                i = futures[future]
                results[i] = self._result(units[i], future)
                if done is not None:
                    done(i, results[i])
        finally:
            for future in futures:
                future.release()
        return results

    def _result(self, unit: Unit, future: Any) -> Any:
        try:
            return unit.decode(future.result())
        except (WorkerMismatch, NoSandbox) as e:
            raise ClusterProblem(str(e)) from None
        except KilledWorker as e:
            tries = getattr(e, "allowed_failures", 0) + 1
            return unit.lost(f"the Dask workers running {unit.label} died {tries} times in it")
        except Exception as e:  # the task raised, and raised again on its retry
            return unit.lost(f"{unit.label} failed on the cluster: {type(e).__name__}: {e}")

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


# --- a real cluster on this machine (the tests and the benchmark) ----------------------------


@contextmanager
def localhost_cluster(workers: int = 2, timeout: float = 90.0) -> Iterator[str]:
    """`dask scheduler` and `workers` separate `dask worker` processes (one thread each) on
    127.0.0.1, on ports the system chose; yields the scheduler's address and tears every process
    down afterwards, failure or not."""
    folder = Path(tempfile.mkdtemp(prefix="xfmr-dask-"))
    info = folder / "scheduler.json"
    procs: list[subprocess.Popen] = []
    log = open(folder / "cluster.log", "wb")  # noqa: SIM115 (closed in finally)

    def start(*argv: str) -> None:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=folder,
            )
        )

    try:
        start(
            "distributed.cli.dask_scheduler",
            "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
            "--scheduler-file", str(info),
        )  # fmt: skip
        for _ in range(workers):
            start(
                "distributed.cli.dask_worker",
                "--scheduler-file", str(info), "--host", "127.0.0.1",
                "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                "--memory-limit", "0", "--death-timeout", "60",
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not info.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise ClusterProblem(f"the scheduler did not start: {_tail(folder)}")
            time.sleep(0.1)
        with Client(scheduler_file=str(info), timeout=CONNECT_TIMEOUT) as client:
            try:
                client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
            except TimeoutError:
                raise ClusterProblem(f"the workers did not join: {_tail(folder)}") from None
            address = client.scheduler.address
        yield address
    finally:
        for proc in reversed(procs):  # workers first, the scheduler last
            _stop(proc)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(folder: Path) -> str:
    return (folder / "cluster.log").read_bytes()[-2000:].decode(errors="replace")
