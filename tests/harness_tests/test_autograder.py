"""The Gradescope autograder, built by `xfmr autograder gradescope` and run as Gradescope runs it.

What is real: the zip is the command's own output, unpacked to /autograder/source; its setup.sh
runs (XFMR_SKIP_INSTALL=1: everything but its apt-get and pip steps: the student user is created,
/autograder closed to it, the isolation tier proved by `xfmr autograder probe` and recorded); its
run_autograder runs once per submission, as root, in /autograder, on /autograder/submission,
and grades with the shipped source (/autograder/source/xfmr-oracle); the sandbox tier's nested
bubblewrap and the container tier's user switch, rlimits and kills are the real ones.

What is simulated: the container is bubblewrap run as root (a tmpfs root, its own pid, ipc and
uts namespaces, a writable copy of /etc, a 1777 /tmp), not Docker; the installed part reuses this
machine's interpreter (/root/.pyenv) and venv, bound read-only at /opt/xfmr-oracle/venv, in
place of setup.sh's apt-get (bubblewrap, python3.11) and pip (torch, the project), which need the
network. Two containers:

- "docker": Docker's defaults imitated: /proc mounted by bwrap with /proc/sys, /proc/irq,
  /proc/bus and /proc/sysrq-trigger covered (a masked /proc: a nested proc mount is refused),
  Docker's default capabilities only (no CAP_SYS_ADMIN), and a seccomp filter that, as Docker's
  profile does, refuses clone/unshare with CLONE_NEWUSER (EPERM) and clone3 (ENOSYS): bubblewrap
  cannot start, setup.sh proves the container tier;
- "userns": the same but with a fresh, unmasked /proc, all capabilities and no filter: nested
  user namespaces work, setup.sh proves the sandbox tier.

Each container grades a correct, a faulty, a forging (a setsid daemon that rewrites
results.json), a syntax-error and a two-file submission (transformer.py importing its own
schedule.py, absolutely, and positions.py, relatively): every results.json exists, is valid per
Gradescope's specification (autograder/gradescope_results.schema.json), and has the deserved
score; no process of the student's user (nor any Python) is left after run_autograder. The
correct and faulty submissions get the full grade in the docker container; the other runs grade
three tests (the mechanism, not the score, is their point).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "autograder"
SUBSET = "test_hand_example_noam,test_golden_torch,test_source_padding_is_never_read"
SUBSET_POINTS = sum(BY_NAME[n].points for n in SUBSET.split(","))
TOTAL = sum(t.points for t in SHARED_TESTS)
VENV = Path(sys.prefix)
# Docker's default capabilities (moby's oci/caps/defaults.go)
DOCKER_CAPS = (
    "CHOWN DAC_OVERRIDE FSETID FOWNER MKNOD NET_RAW SETGID SETUID SETFCAP SETPCAP "
    "NET_BIND_SERVICE SYS_CHROOT KILL AUDIT_WRITE"
).split()

needs_root_and_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or sys.platform != "linux",
    reason="the simulated container is bubblewrap run as root",
)


def schema() -> dict:
    return json.loads((DATA / "gradescope_results.schema.json").read_text())


def valid(results: dict) -> None:
    """Valid per Gradescope's specification, with a top-level score (ours always has one)."""
    import jsonschema

    jsonschema.validate(results, schema())
    assert isinstance(results.get("score"), int | float), results


def docker_seccomp() -> bytes:
    """A classic BPF seccomp program (x86_64) refusing what Docker's default profile refuses to
    an unprivileged container and bubblewrap needs: clone and unshare with CLONE_NEWUSER
    (EPERM), clone3 (ENOSYS, so that libc falls back to clone)."""

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    return b"".join(
        [
            op(ld, 0, 0, 4),  # arch
            op(jeq, 1, 0, 0xC000003E),  # x86_64
            op(ret, 0, 0, allow),
            op(ld, 0, 0, 0),  # syscall number
            op(jeq, 5, 0, 435),  # clone3 -> ENOSYS
            op(jeq, 1, 0, 56),  # clone -> flags
            op(jeq, 0, 2, 272),  # unshare -> flags, else allow
            op(ld, 0, 0, 16),  # args[0]: the flags
            op(jset, 2, 0, 0x10000000),  # CLONE_NEWUSER -> EPERM
            op(ret, 0, 0, allow),
            op(ret, 0, 0, errno | 38),
            op(ret, 0, 0, errno | 1),
        ]
    )


# --- the submissions ------------------------------------------------------------------------


def two_files(folder: Path) -> None:
    """examples/correct_submission.py split in three: noam_rate in schedule.py (imported as
    `from schedule import noam_rate`), sinusoids in positions.py (`from .positions import`)."""
    source = (ROOT / "examples" / "correct_submission.py").read_text()
    noam = source[source.index("def noam_rate") : source.index("def make_optimizer")]
    sinus = source[source.index("def sinusoids") : source.index("def check_bool")]
    main_text = source.replace(noam, "from schedule import noam_rate  # the student's own\n\n\n")
    main_text = main_text.replace(sinus, "from .positions import sinusoids  # relative\n\n\n")
    (folder / "transformer.py").write_text(main_text)
    (folder / "schedule.py").write_text("import math\n\n\n" + noam)
    (folder / "positions.py").write_text("import math\n\nimport torch\n\n\n" + sinus)


def submissions(inputs: Path, full: bool) -> dict[str, tuple[float, str]]:
    """The five submissions under inputs/NAME/files, each with the run_autograder it gets
    (inputs/NAME/mode); their deserved scores and what their output must say."""
    correct = (ROOT / "examples" / "correct_submission.py").read_text()
    faulty = (ROOT / "examples" / "faulty_submission.py").read_text()
    made = {
        "correct": (correct, "full" if full else "subset"),
        "faulty": (faulty, "full" if full else "subset"),
        "forging": (correct + (DATA / "forger.py").read_text(), "subset"),
        "syntax_error": (
            correct.replace("def make_optimizer(", "def make_optimizer(:", 1),
            "subset",
        ),
        "two_files": (None, "subset"),
    }
    for name, (text, mode) in made.items():
        files = inputs / name / "files"
        files.mkdir(parents=True)
        (inputs / name / "mode").write_text(mode)
        if text is None:
            two_files(files)
        else:
            (files / "transformer.py").write_text(text)
    faulty_lost = (
        BY_NAME["test_golden_torch"].points + BY_NAME["test_source_padding_is_never_read"].points
    )
    faulty_full = (
        TOTAL
        - faulty_lost
        - sum(
            BY_NAME[n].points
            for n in (
                "test_translate_is_greedy_with_beam_one_and_drops_eos",
                "test_beam_search_matches_oracle",
            )
        )
    )
    return {
        "correct": (TOTAL if full else SUBSET_POINTS, "tests passed"),
        "faulty": (faulty_full if full else SUBSET_POINTS - faulty_lost, "tests passed"),
        "forging": (SUBSET_POINTS, "3/3 tests passed"),
        "syntax_error": (0.0, "does not parse"),
        "two_files": (SUBSET_POINTS, "3/3 tests passed"),
    }


# --- the simulated container -----------------------------------------------------------------


def build(out: Path, *options: str) -> None:
    """The autograder zip, by the real command."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", "autograder", "gradescope", "--out", str(out), *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def container(variant: str, tmp: Path) -> tuple[Path, float]:
    """Build the autograders, run the simulated container `variant`; its /xfmr-out and wall time."""
    autograder, inputs, out, etc = (tmp / n for n in ("autograder", "in", "out", "etc"))
    for folder in (autograder / "source", inputs, out):
        folder.mkdir(parents=True)
    build(tmp / "autograder.zip")
    build(tmp / "subset.zip", "--tests", SUBSET)
    with zipfile.ZipFile(tmp / "autograder.zip") as z:
        z.extractall(autograder / "source")
    for zipped, mode in ((tmp / "autograder.zip", "full"), (tmp / "subset.zip", "subset")):
        with zipfile.ZipFile(zipped) as z:
            (inputs / f"run_autograder.{mode}").write_bytes(z.read("run_autograder"))
    for name in ("setup.sh", "run_autograder"):  # zipfile.extractall drops the modes
        (autograder / "source" / name).chmod(0o755)
    for script in inputs.glob("run_autograder.*"):
        script.chmod(0o755)
    os.chmod(out, 0o700)
    expected = submissions(inputs, full=variant == "docker")
    (out / "expected.json").write_text(json.dumps(expected))
    subprocess.run(["cp", "-a", "/etc", str(etc)], check=True)
    args = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "gradescope"]
    args += ["--ro-bind", "/usr", "/usr", "--bind", str(etc), "/etc", "--dev", "/dev"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/var", "--dir", "/var/log"]
    args += ["--tmpfs", "/root"]
    for folder in [
        *reversed(Path(sys.base_prefix).parents[:-2]),
        Path("/opt"),
        Path("/opt/xfmr-oracle"),
    ]:
        args += ["--perms", "0755", "--dir", str(folder)]  # as an image's would be
    args += ["--ro-bind", sys.base_prefix, sys.base_prefix]
    args += ["--ro-bind", str(VENV), "/opt/xfmr-oracle/venv"]
    args += ["--bind", str(autograder), "/autograder", "--ro-bind", str(inputs), "/xfmr-in"]
    args += ["--bind", str(out), "/xfmr-out", "--ro-bind", str(DATA), "/xfmr-data"]
    args += ["--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]
    fds: tuple[int, ...] = ()
    if variant == "docker":
        args += ["--proc", "/proc", "--cap-drop", "ALL"]
        for cap in DOCKER_CAPS:
            args += ["--cap-add", f"CAP_{cap}"]
        read, write = os.pipe()
        os.write(write, docker_seccomp())
        os.close(write)
        args += ["--seccomp", str(read)]
        fds = (read,)
    else:
        args += ["--dir", "/proc", "--cap-add", "ALL"]
    args += ["--", "/bin/bash", "/xfmr-data/in_container.sh", variant]
    begun = time.monotonic()
    try:
        done = subprocess.run(args, pass_fds=fds, capture_output=True, text=True, timeout=600)
    finally:
        for fd in fds:
            os.close(fd)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return out, time.monotonic() - begun


@needs_root_and_bwrap
@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, tier",
    [("docker", "container"), ("userns", "sandbox")],
)
def test_run_autograder_in_a_simulated_gradescope_container(tmp_path, variant, tier):
    out, wall = container(variant, tmp_path)
    setup = (out / "setup.log").read_text()
    status, begun, ended = (out / "setup.status").read_text().split()
    assert status == "0", setup
    record = (tmp_path / "autograder" / "source" / "isolation").read_text()
    assert record.splitlines()[0] == tier, record  # what setup.sh proved works here
    expected = json.loads((out / "expected.json").read_text())
    print(f"\n{variant}: setup.sh {float(ended) - float(begun):.1f} s; container {wall:.1f} s")
    print(f"  isolation record: {record.strip()!r}")
    for name, (score, says) in expected.items():
        stdout = (out / f"{name}.stdout").read_text()
        assert (out / f"{name}.json").is_file(), f"{name}: no results.json\n{stdout}"
        results = json.loads((out / f"{name}.json").read_text())
        valid(results)
        status, begun, ended = (out / f"{name}.status").read_text().split()
        first = results["output"].splitlines()[0]
        print(
            f"  {name}: {results['score']:g} in {float(ended) - float(begun):.1f} s "
            f"(run_autograder status {status}): {first}"
        )
        assert results["score"] == score, (name, results["output"], stdout)
        assert says in results["output"], (name, results["output"])
        left = (out / f"{name}.left").read_text()
        assert left == "", f"{name}: left running after run_autograder:\n{left}"
    # the forging daemon did run (as the student's user, where /tmp is shared) and forged nothing
    if tier == "container":
        marks = (out / "forging.marks").read_text().split()
        uid = [line for line in (tmp_path / "etc" / "passwd").read_text().splitlines()]
        student = next(line.split(":")[2] for line in uid if line.startswith("xfmr-student:"))
        assert marks == [f"xfmr-forger-ran-as-{student}"], marks
    two = json.loads((out / "two_files.json").read_text())
    assert all(t["status"] == "passed" for t in two["tests"]), two
    bad = json.loads((out / "syntax_error.json").read_text())
    assert "transformer.py line" in bad["output"] and "/sandbox" not in bad["output"], bad


# --- without a container ----------------------------------------------------------------------


def test_the_zip_is_gradescopes_layout_with_the_law_records_points(tmp_path):
    zipped = tmp_path / "autograder.zip"
    assert main(["autograder", "gradescope", "--out", str(zipped)]) == 0
    with zipfile.ZipFile(zipped) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        about = json.loads(z.read("assignment.json"))
        scripts = {n: z.read(n).decode() for n in ("setup.sh", "run_autograder")}
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    for package in ("oracle", "impl", "harness", "mutants", "tasks"):
        assert f"xfmr-oracle/{package}/__init__.py" in names
    assert "xfmr-oracle/pyproject.toml" in names and not any("__pycache__" in n for n in names)
    assert not any(n.startswith(("xfmr-oracle/tests", "xfmr-oracle/.git")) for n in names)
    assert about["total_points"] == TOTAL
    assert [(t["name"], t["points"], t["visibility"]) for t in about["tests"]] == [
        (t.name, float(t.points), t.visibility) for t in SHARED_TESTS
    ]
    setup = scripts["setup.sh"]
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup
    assert "python3.11" in setup and "bubblewrap" in setup and "useradd" in setup
    assert "--unsafe-no-sandbox" not in setup + scripts["run_autograder"]
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        done = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)


def test_no_isolation_is_a_valid_results_json_that_tells_staff(tmp_path, capsys):
    """A container tier that cannot be set up (here: its user does not exist, or this is not
    root) refuses: exit 2, and a results.json with score 0 saying why, never a missing file;
    --unsafe-no-sandbox is not offered."""
    report = tmp_path / "results.json"
    argv = ["grade", str(ROOT / "examples" / "correct_submission.py"), "--gradescope", str(report)]
    assert main([*argv, "--isolation", "container"]) == 2
    err = capsys.readouterr().err
    assert "refusing to run untrusted code" in err and "--unsafe-no-sandbox" not in err
    results = json.loads(report.read_text())
    valid(results)
    assert results["score"] == 0 and results["output"].startswith("NOT GRADED")
    assert "Course staff: refusing to run untrusted code: the container tier" in results["output"]
    assert [t["max_score"] for t in results["tests"]] == [float(t.points) for t in SHARED_TESTS]


def test_the_refusal_of_run_autograder_reads_setups_reasons(tmp_path):
    record = tmp_path / "isolation"
    record.write_text("none\nsandbox: cannot be set up: X\ncontainer: cannot be set up: Y\n")
    report = tmp_path / "results.json"
    argv = ["autograder", "refuse", "--why", str(record), "--out", str(report)]
    assert main([*argv, "--tests", "test_hand_example_noam"]) == 2
    results = json.loads(report.read_text())
    valid(results)
    assert results["score"] == 0 and "X; container: cannot be set up: Y" in results["output"]
