"""The next self-check's draws, prepared while the student edits.

Every self-check draws a fresh secret, and the parent's most costly work for it is the oracle's
bounds for that secret's draws (verdicts.derived: about 2.9 s of CPU on the correct example, 2.2 s
of it the golden test's, on a 2-core laptop beside two workers). So when `xfmr check` has printed
its result it starts one detached process (`prepare_next`) that draws the next check's secret and
checks the known-correct model on it (harness.canary's subject, through the self-check's own
workers), keeping every bound it derives in a folder of its own (harness.shared_tests.
bounds_store's files): the bounds a correct submission's check will ask for; then it marks the
folder ready (never where the known-correct model did not pass). The next
check claims a ready folder (`claimed`: a rename, so two checks never share one), runs on its secret
with those bounds found on disk, and deletes it. A preparation still running when a check starts is
stopped: it would only compete with the check for the CPU. A preparation is known to be running
by the lock it holds on a file in its folder for as long as it lives (`_running`), never by its
process id alone: an id can be reused, and where /proc belongs to another pid namespace (some
containers) no command line can be read by id either.

Nothing of this decides a verdict: the draws are the same function of the secret, and the bounds the
same function of the draws, wherever they were computed; a folder that cannot be read is ignored and
the check derives its bounds itself. The secret sits in the student's own cache, which matters to no
one: a self-check judges the student's own code, for the student.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from harness import canary
from harness.records import Grade
from harness.shared_tests.inputs import draw_secret, set_draw_secret

READY, PREPARING, CLAIMED = "ready-", "preparing-", "claimed-"
DRAW_FILE = "draw.json"
SEED_VARIABLE = "XFMR_DRAW_SEED"  # a fixed secret (to reproduce a run): nothing is claimed
# how `xfmr check` is told to prepare a draw (a hidden option): the preparation's command line
PREPARE_FLAG = "--prepare-next-draw"
SWITCH = "XFMR_CHECK_AHEAD"  # 0: no check prepares the next one's draws (the test suite's)
LOCK_FILE = "running.lock"  # in a preparation's folder: locked for as long as the process lives
STARTING = ".starting-"  # a preparation's folder before it holds its lock (then renamed)


def wanted() -> bool:
    """Whether a check prepares the next one's draws (unless XFMR_CHECK_AHEAD=0)."""
    return os.environ.get(SWITCH, "1").strip() not in ("0", "no", "false", "off")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(folder: Path) -> bool:
    """Whether the preparation of `folder` still runs: something holds the lock of its LOCK_FILE
    (the preparation itself: it takes the lock before the folder gets its name, and every process
    it starts gets fresh descriptors). A lock dies with its process, so an id the system has since
    given another process never reads as running."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # and with it the lock, where this process got it
    return False


def _pid_of(folder: Path, prefix: str) -> int | None:
    try:
        return int(folder.name[len(prefix) :].split("-", 1)[0])
    except ValueError:
        return None


def _sweep(root: Path) -> None:
    """Remove what dead processes left: a preparation whose lock nobody holds, a claim whose
    process is gone."""
    for prefix in (PREPARING, STARTING):
        for left in root.glob(f"{prefix}*"):
            if not _running(left):
                shutil.rmtree(left, ignore_errors=True)
    for left in root.glob(f"{CLAIMED}*"):
        pid = _pid_of(left, CLAIMED)
        if pid is None or not _alive(pid):
            shutil.rmtree(left, ignore_errors=True)


def stop_preparing(root: Path) -> None:
    """Stop a preparation that is still running (it is started again after this check). SIGKILL:
    a preparation has nothing to save (its folder becomes ready by one rename, or is swept), and
    unlike SIGTERM it cannot be ignored or blocked by what the student's shell or a CI runner
    passed down to the process."""
    for busy in root.glob(f"{PREPARING}*"):
        pid = _pid_of(busy, PREPARING)
        if pid is not None and pid != os.getpid() and _running(busy):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def claimed(root: Path, store: Path) -> Iterator[bool]:
    """Within: this process's draws are those of a ready folder under `root`, if there is one
    (yields True; its bounds moved into `store`, the self-check's bounds folder), else the
    process's own (False). The run's secret is restored after. Nothing is claimed where
    XFMR_DRAW_SEED fixes the secret."""
    if os.environ.get(SEED_VARIABLE) or not root.is_dir():
        yield False
        return
    stop_preparing(root)
    _sweep(root)
    mine: Path | None = None
    secret: int | None = None
    for ready in sorted(root.glob(f"{READY}*")):
        target = root / f"{CLAIMED}{os.getpid()}-{ready.name}"
        try:
            os.rename(ready, target)
        except OSError:  # another check took it first
            continue
        mine = target
        try:
            secret = int(json.loads((target / DRAW_FILE).read_text())["secret"])
            store.mkdir(parents=True, exist_ok=True)
            for kept in target.glob("*.npz"):
                os.replace(kept, store / kept.name)
        except (OSError, ValueError, KeyError, TypeError):
            secret = None
        break
    before = draw_secret()
    if secret is not None:
        set_draw_secret(secret)
    try:
        yield secret is not None
    finally:
        set_draw_secret(before)
        if mine is not None:
            shutil.rmtree(mine, ignore_errors=True)


def prepare_next(root: Path) -> bool:
    """Start the detached preparation of the next check's draws, unless one is ready or running
    (True: started). Its output goes nowhere; it holds no terminal."""
    if os.environ.get(SEED_VARIABLE):
        return False
    try:
        root.mkdir(parents=True, exist_ok=True)
        _sweep(root)
        if any(root.glob(f"{READY}*")) or any(root.glob(f"{PREPARING}*")):
            return False
        subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "check", PREPARE_FLAG, str(root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return False
    return True


def prepare(root: Path, check: Callable[[Path, Path], Grade]) -> Path | None:
    """Draw a secret, run `check(model, bounds folder)` on the known-correct model with it, and
    mark the folder ready (a rename: a folder is ready whole or not at all). The ready folder;
    None where the known-correct model is not there or did not pass."""
    secret = secrets.randbits(63)
    root.mkdir(parents=True, exist_ok=True)
    starting = Path(tempfile.mkdtemp(prefix=STARTING, dir=root))
    # the lock first, then the folder's name: a check never sees a preparation without its lock
    with open(starting / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy = root / f"{PREPARING}{os.getpid()}-{secret:016x}"
        os.rename(starting, busy)
        return _prepared(root, busy, secret, check)


def _prepared(
    root: Path, busy: Path, secret: int, check: Callable[[Path, Path], Grade]
) -> Path | None:
    text = canary.subject_text()
    if text is None:
        shutil.rmtree(busy, ignore_errors=True)
        return None
    set_draw_secret(secret)
    # the model in a private (0700) folder inside the preparation's own, so that a preparation
    # stopped half-way leaves it nowhere but where the next sweep removes it
    with tempfile.TemporaryDirectory(prefix="model-", dir=busy) as folder:
        model = Path(folder) / "transformer.py"
        model.write_bytes(text)
        g = check(model, busy)
    if not g.passed or g.error:
        shutil.rmtree(busy, ignore_errors=True)
        return None
    (busy / DRAW_FILE).write_text(json.dumps({"secret": secret}))
    ready = root / f"{READY}{secret:016x}"
    os.rename(busy, ready)
    return ready


def run_prepared(root: Path, check: Callable[[Path, Path], Grade]) -> int:
    """The detached preparation (`xfmr check --prepare-next-draw ROOT`): 0 when a draw was made
    ready, 1 when none was (what it left is removed)."""
    try:
        made = prepare(root, check)
    except Exception:  # nothing is ready then: the next check derives its own bounds
        made = None
    for busy in root.glob(f"{PREPARING}{os.getpid()}-*"):
        shutil.rmtree(busy, ignore_errors=True)
    return 0 if made is not None else 1
