"""The grader proves its own workers before it trusts a verdict of theirs.

A worker that cannot run a correct model in this environment (a torch build that maps more
address space than the limits allow, a sandbox that starts but cannot import, a machine too
loaded to answer in time) would fail every student for the grader's own fault. So before the
first verdict of an environment, the shared test CANARY_TESTS runs on a subject known to be
correct (impl, staged as a submission file and run through the very workers the grade will use:
the same tier, limits, staging and load path). If it does not pass, the grade is a GRADER ERROR:
nothing is charged, every report says so, and the cause and its fix are named.

In the student kit (harness.jobs.kit) impl has no source file: its text is read from the
kit's sealed blob (harness.sealed) and written only into the proof's private staging folder.

A pass is kept per environment fingerprint (the interpreter, the torch build, the grader's
version, the worker's and impl's code, the isolation tier and the limits): in this process, and
on disk under the user's cache (XFMR_CANARY_CACHE, else XDG_CACHE_HOME or ~/.cache, then
xfmr-oracle/canary), so a class's grades and a student's later checks do not pay for it again.
A failure is never kept: the next grade tries again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness import sealed
from harness.outcomes import Outcome
from harness.records import Grade

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The known-correct subject and where the worker's own code lives (both part of the fingerprint).
SUBJECT = PROJECT_ROOT / "impl" / "transformer.py"
SUBJECT_REL = "impl/transformer.py"
WORKER_CODE = PROJECT_ROOT / "harness" / "isolation" / "child"
# The proof: loading the subject, the pushed weights, a forward and backward pass in both norms
# and every tying, judged against the oracle (1-2 s after a worker's start-up).
CANARY_TESTS = ("test_golden_torch",)
CACHE = "XFMR_CANARY_CACHE"
GRADER_ERROR = "GRADER ERROR"

_proven: dict[str, str] = {}  # fingerprint -> "" (proven) in this process
_lock = threading.Lock()  # grade-batch grades side by side: one proof per environment


def cache_dir() -> Path:
    if given := os.environ.get(CACHE):
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xfmr-oracle" / "canary"


def _torch_build() -> str:
    """Which torch a worker imports, read without importing it (an import costs the parent about
    a second of every self-check): where it is installed and its version.py, which names the
    version, the git commit and the CUDA build."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return "torch unavailable: not found"
        version = Path(spec.origin).with_name("version.py").read_bytes()
        return f"{os.path.realpath(spec.origin)} {hashlib.sha256(version).hexdigest()}"
    except Exception as e:  # said in the fingerprint; the proof itself will fail and say why
        return f"torch unavailable: {type(e).__name__}"


def subject_text() -> bytes | None:
    """The known-correct subject's text: impl's source file, or in the student kit its sealed
    text (harness.sealed); None where neither is there."""
    try:
        return SUBJECT.read_bytes()
    except OSError:
        found = sealed.sealed_texts().get(SUBJECT_REL)
        return None if found is None else found.encode()


def _code_hash() -> str:
    digest = hashlib.sha256()
    digest.update(SUBJECT_REL.encode())
    digest.update(subject_text() or b"?")
    for path in [*sorted(WORKER_CODE.rglob("*.py")), PROJECT_ROOT / "harness" / "wire.py"]:
        try:
            digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode())
            digest.update(path.read_bytes())
        except (OSError, ValueError):
            digest.update(b"?")
    return digest.hexdigest()


def fingerprint(environment: str) -> str:
    """What decides whether a correct model passes here: the interpreter, the torch build, the
    grader's version and code, and `environment` (the front end's tier and limits)."""
    try:
        grader = version("xfmr-oracle")
    except PackageNotFoundError:
        grader = "unknown"
    parts = [
        os.path.realpath(sys.executable),
        sys.version,
        platform.release(),
        _torch_build(),
        grader,
        _code_hash(),
        environment,
        ",".join(CANARY_TESTS),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _cached(key: str) -> bool:
    try:
        return json.loads((cache_dir() / f"{key}.json").read_text()).get("passed") is True
    except (OSError, ValueError, AttributeError):
        return False


def _keep(key: str, seconds: float) -> None:
    """Write the pass; a cache that cannot be written only costs the next process a proof."""
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
            json.dump({"passed": True, "seconds": round(seconds, 2)}, f)
        os.replace(f.name, folder / f"{key}.json")
    except OSError:
        pass


def fix_for(message: str) -> str:
    """What staff can do about a failed proof, from what the correct model's worker said."""
    if any(m in message for m in ("MemoryError", "failed to map", "Cannot allocate memory")):
        return (
            "the workers' address space is too small for this machine's torch build: raise "
            "--memory-mb (the room a worker may map beyond torch's own mappings), or install "
            "torch's CPU build (README: set up a fresh machine)"
        )
    if "timed out" in message or "WorkerTimeout" in message:
        return "the machine is too loaded to answer in time: grade fewer at once (--jobs)"
    if "ModuleNotFoundError" in message or "ImportError" in message:
        return "the worker's interpreter lacks a package the grader needs: reinstall the grader"
    return "this environment cannot run a correct model: report this message to the course's staff"


def reason(failed: Grade) -> str:
    """The grader error said for a failed proof: the first failure, then the fix."""
    first = next((t for t in failed.tests if t.outcome is not Outcome.PASSED), None)
    said = failed.error or failed.rejected or (first.message if first else "no test passed")
    lines = said.strip().splitlines()
    # a traceback's news is its last line (the exception), a message's its first
    said = (lines[-1] if lines[0].startswith("Traceback") else lines[0]) if lines else "no message"
    return (
        f"{GRADER_ERROR}: the grader's workers cannot run a correct model in this environment, "
        f"so no verdict of theirs can be trusted and nothing was charged. The known-correct "
        f"model's {first.name if first else 'grade'}: {said}. Fix: {fix_for(said)}."
    )


def prove(environment: str, run: Callable[[Path], Grade]) -> str:
    """ "" if a correct model passes CANARY_TESTS through `run` (the grade's own workers, given
    the path of the known-correct file to grade) in this environment, proven now or before;
    else the grader error to say. `run` is called at most once per environment and process."""
    key = fingerprint(environment)
    with _lock:
        if key in _proven or _cached(key):
            _proven[key] = ""
            return ""
        text = subject_text()
        if text is None:
            return (
                f"{GRADER_ERROR}: the known-correct model ({SUBJECT_REL}) is missing from this "
                f"install, so the workers cannot be proven; nothing was charged. Fix: "
                f"{fix_for('ModuleNotFoundError')}."
            )
        with tempfile.TemporaryDirectory(prefix="xfmr-canary-") as folder:
            copy = Path(folder) / "transformer.py"
            copy.write_bytes(text)
            try:
                proof = run(copy)
            except Exception as e:  # the grader's own failure is a failed proof too
                return (
                    f"{GRADER_ERROR}: proving the workers on a correct model broke the grader "
                    f"({type(e).__name__}: {e}); nothing was charged. Fix: {fix_for(str(e))}."
                )
        if proof.passed and not proof.error:
            _proven[key] = ""
            _keep(key, proof.seconds)
            return ""
        return reason(proof)
