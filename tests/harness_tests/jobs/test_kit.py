"""The student kit (harness.jobs.kit): a wheel with the students' commands and no readable
reference.

The search below reads every file of the wheel as a student's tools would: as text, inside each
.pyc's constants (strings, and bytes as they are), and after every decompression the standard
library offers (zlib, gzip, bz2, lzma); it looks for the reference's distinctive lines (impl, the
torch copy, the oracle, every mutant's patch). It is shown to find impl's source, an unsealed
oracle .pyc and a zlib-compressed patch when they are put in. The slow test installs the wheel
into a fresh venv and runs the students' commands from a folder outside the project.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import lzma
import marshal
import os
import py_compile
import shutil
import subprocess
import sys
import time
import types
import zipfile
import zlib
from pathlib import Path

import pytest

from harness import canary, cli, sealed
from harness.jobs import kit

ROOT = kit.ROOT


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> kit.Kit:
    return kit.build(tmp_path_factory.mktemp("kit"))


@pytest.fixture(scope="module")
def lines() -> set[str]:
    return kit.reference_lines()


def _decompressed(data: bytes) -> list[bytes]:
    out = [data]
    for unpack in (zlib.decompress, gzip.decompress, bz2.decompress, lzma.decompress):
        try:
            out.append(unpack(data))
        except Exception:
            pass
    return out


def _constants(code: types.CodeType) -> list[object]:
    found: list[object] = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            found += _constants(c)
        elif isinstance(c, tuple | frozenset):
            found += [x for x in c if isinstance(x, str | bytes)]
        else:
            found.append(c)
    return found


def texts(name: str, data: bytes) -> list[str]:
    """What a student's tools read in one file of the wheel."""
    blobs = _decompressed(data)
    strings: list[str] = []
    if name.endswith(".pyc"):
        for c in _constants(marshal.loads(data[16:])):
            if isinstance(c, str):
                strings.append(c)
            elif isinstance(c, bytes):
                blobs += _decompressed(c)
    return strings + [b.decode("utf-8", "replace") for b in blobs]


def found_in(wheel: Path, lines: set[str]) -> list[str]:
    """'file: line' for each distinctive reference line anywhere in the wheel."""
    hits = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            for text in texts(name, z.read(name)):
                for line in text.splitlines():
                    s = line.strip()
                    for candidate in (s, s.split("  #")[0].rstrip()):
                        if candidate in lines:
                            hits.append(f"{name}: {candidate}")
    return sorted(set(hits))


def with_file(wheel: Path, tmp_path: Path, name: str, data: bytes) -> Path:
    copy = tmp_path / wheel.name
    shutil.copyfile(wheel, copy)
    with zipfile.ZipFile(copy, "a") as z:
        z.writestr(name, data)
    return copy


# --- what the reference is --------------------------------------------------------------------


def test_the_reference_lines_hold_impl_the_oracle_and_the_patches(lines):
    from mutants import catalog

    impl = (ROOT / "impl" / "transformer.py").read_text()
    assert "scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, h, T, S]" in lines
    assert len([x for x in lines if x in impl]) > 300
    oracle_ops = (ROOT / "oracle" / "ops.py").read_text()
    assert len([x for x in lines if x in oracle_ops]) > 50
    # a pitfall's new text (not impl's) is there
    news = {
        s for m in catalog.MUTANTS for p in m.patches for s in kit._lines(p.new) if s not in impl
    }
    assert news and news <= lines | kit.IDIOMS


def test_every_idiom_is_the_harness_own_code():
    # an idiom is exempt only because the harness's shipped code writes it too, never to hide a
    # reference line: each is in some source file the kit ships
    files, _ = kit.entries()
    shipped = "\n".join(e.data.decode() for e in files if e.how == "source")
    assert all(idiom in shipped for idiom in kit.IDIOMS), [
        i for i in kit.IDIOMS if i not in shipped
    ]


# --- the kit holds none of it -----------------------------------------------------------------


def test_no_reference_text_in_the_kit(built, lines):
    assert found_in(built.wheel, lines) == []
    with zipfile.ZipFile(built.wheel) as z:
        names = set(z.namelist())
    for rel in kit.SEALED_TEXTS + ("mutants/student_faults.py",):
        assert rel not in names
    assert not [
        n for n in names if n.startswith(("harness/tools/", "oracle/")) and n.endswith(".py")
    ]
    assert {"oracle/ops.pyc", "mutants/catalog.pyc", "harness/data/reference.sealed"} <= names
    assert {"harness/students/selfcheck.py", "CONTRACT.md", "impl/contract.pyi"} <= names


def test_the_search_finds_impl_when_it_is_added(built, lines, tmp_path):
    source = (ROOT / "impl" / "transformer.py").read_bytes()
    hits = found_in(with_file(built.wheel, tmp_path, "impl/transformer.py", source), lines)
    assert len(hits) > 300 and all(h.startswith("impl/transformer.py: ") for h in hits)


def test_the_search_reads_a_pyc_s_constants(built, lines, tmp_path):
    plain = tmp_path / "ops.pyc"  # the oracle compiled as usual: its docstrings are constants
    py_compile.compile(str(ROOT / "oracle" / "ops.py"), str(plain), doraise=True)
    hits = found_in(
        with_file(built.wheel, tmp_path, "oracle/ops_plain.pyc", plain.read_bytes()), lines
    )
    assert hits


def test_the_search_decompresses(built, lines, tmp_path):
    from mutants import catalog

    patch = next(p.new for m in catalog.MUTANTS for p in m.patches if kit._lines(p.new) & lines)
    blob = zlib.compress(patch.encode())
    assert patch.encode() not in blob
    assert found_in(with_file(built.wheel, tmp_path, "harness/data/x.bin", blob), lines)


def test_the_build_refuses_a_module_that_holds_the_reference(monkeypatch, tmp_path):
    left = tuple(x for x in kit.LEFT_OUT if x != "impl/torch_copy.py")
    monkeypatch.setattr(kit, "LEFT_OUT", left)
    with pytest.raises(kit.KitError, match="impl/torch_copy.py: "):
        kit.build(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written


# --- sealed bytecode --------------------------------------------------------------------------

SAMPLE = '''"""A module docstring: SECRET LINE ONE of the reference."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Config:
    """SECRET LINE TWO in a class docstring."""

    norm: str = "post-secret"
    sizes: tuple[str, ...] = ("a-secret", "b-secret")


def describe(c: Config, n: int = 3) -> str:
    """SECRET LINE THREE."""
    match c.norm:
        case "pre":
            kind = "pre-norm"
        case _:
            kind = f"{c.norm}/{n:>4}|{'secret-in-fstring'}"
    return kind + " " + ",".join(c.sizes)
'''


def test_sealed_bytecode_imports_without_source_and_shows_no_string(tmp_path, monkeypatch):
    pyc = tmp_path / "sealed_sample.pyc"
    pyc.write_bytes(kit.sealed_code(SAMPLE, "sealed_sample.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.find_spec("sealed_sample")
    assert spec is not None and spec.origin == str(pyc)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sealed_sample"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        plain = types.ModuleType("plain_sample")
        sys.modules["plain_sample"] = plain
        exec(compile(SAMPLE, "plain_sample.py", "exec"), plain.__dict__)
    finally:
        sys.modules.pop("sealed_sample", None)
        sys.modules.pop("plain_sample", None)
    for cfg in ({}, {"norm": "pre"}):
        assert module.describe(module.Config(**cfg), 7) == plain.describe(plain.Config(**cfg), 7)
    assert module.describe.__doc__ is None and module.__doc__ is None
    data = pyc.read_bytes()
    assert b"secret" not in data.lower() and b"SECRET" not in data
    assert not any("secret" in t.lower() for t in texts("x.pyc", data))


# --- the kit's own commands and refusals ------------------------------------------------------


def test_the_wheel_is_tagged_for_this_interpreter(built):
    major, minor = sys.version_info[:2]
    assert built.wheel.name.endswith(f"-cp{major}{minor}-none-any.whl")
    with zipfile.ZipFile(built.wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(info).decode()
        points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
        manifest = json.loads(z.read("harness/data/kit.json"))
    assert f"Requires-Python: =={major}.{minor}.*" in meta
    assert "Requires-Dist: torch" in meta and 'extra == "test"' in meta
    assert "xfmr = harness.cli:main" in points and "xfmr = harness.students.pytest_plugin" in points
    assert manifest["interpreter"] == sealed.interpreter()
    assert manifest["commands"]["milestone"] == "harness.students.milestone"
    assert "INSTALL" in built.install.name and built.wheel.name in built.install.read_text()


def _as_kit(monkeypatch, interpreter: str | None = None) -> None:
    manifest = {
        "interpreter": interpreter or sealed.interpreter(),
        "commands": {c: cli.COMMANDS[c][0] for c in kit.COMMANDS},
    }
    monkeypatch.setattr(sealed, "manifest", lambda: manifest)


def test_in_the_kit_a_staff_command_refuses_and_is_not_listed(monkeypatch, capsys):
    _as_kit(monkeypatch)
    assert cli.main(["grade", "x.py"]) == 2
    assert "staff command, not part of the student kit" in capsys.readouterr().err
    usage = cli._usage()
    assert "  check " in usage and "  grade " not in usage and "the oracle:" not in usage
    assert usage.count("milestone") == 1  # the students' line, not the demo on impl


def test_the_kit_refuses_another_interpreter(monkeypatch, capsys):
    _as_kit(monkeypatch, interpreter="cpython 3.99")
    assert cli.main(["check", "x.py"]) == 2
    err = capsys.readouterr().err
    assert "built for cpython 3.99" in err and sealed.interpreter() in err


def test_outside_the_kit_every_command_is_offered():
    assert not sealed.in_kit() and all(sealed.offers(c) for c in cli.COMMANDS)
    assert sealed.refusal("grade") == ""


def test_the_canary_stages_impl_from_the_sealed_text(monkeypatch, tmp_path):
    # the project's install: impl's file, hashed as before; the kit: the sealed text
    assert canary.subject_text() == canary.SUBJECT.read_bytes()
    text = (ROOT / "impl" / "transformer.py").read_text()
    before = canary._code_hash()
    monkeypatch.setattr(canary, "SUBJECT", tmp_path / "absent.py")
    monkeypatch.setattr(sealed, "sealed_texts", lambda: {"impl/transformer.py": text})
    assert canary._code_hash() == before  # the same subject, the same fingerprint
    monkeypatch.setenv(canary.CACHE, str(tmp_path / "cache"))
    staged = []

    def run(path: Path):
        staged.append(path.read_text())
        raise RuntimeError("stop here")

    said = canary.prove("kit test", run)
    assert staged == [text] and "stop here" in said
    monkeypatch.setattr(sealed, "sealed_texts", lambda: {})
    assert "missing from this install" in canary.prove("kit test 2", run)


def test_diff_in_the_kit_says_where_the_course_shows_the_reference(monkeypatch, tmp_path, capsys):
    from harness.students import diff

    mine = tmp_path / "transformer.py"
    mine.write_text("x = 1\n")
    monkeypatch.setattr(diff, "REFERENCE", tmp_path / "absent.py")
    monkeypatch.setattr(diff, "failing_from_check", lambda path: ([], None))
    parser = cli.argparse.ArgumentParser()
    diff.configure_diff(parser)
    assert diff.run_diff(parser.parse_args([str(mine)])) == 0
    out = capsys.readouterr().out
    assert "not in the student kit" in out and "--reveal-reference-after-pass" in out


# --- installed in a fresh venv ----------------------------------------------------------------


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[str, float]:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - start
    assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout + done.stderr, seconds


@pytest.mark.slow
def test_the_kit_runs_the_students_commands_in_a_fresh_venv(built, tmp_path):
    """pip install of the wheel (its dependencies from this machine's package index: the CPU
    torch), then start, check, pytest --xfmr, diff and the smoke milestone from a folder outside
    the project; the canary proves the workers on impl's sealed text (a fresh cache)."""
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(XFMR_CANARY_CACHE=str(tmp_path / "canary"), PYTHONDONTWRITEBYTECODE="1")
    base = getattr(sys, "_base_executable", sys.executable)
    times: dict[str, float] = {}
    _, times["venv"] = _run([base, "-m", "venv", str(venv)], work, env, 300)
    py, xfmr = str(venv / "bin" / "python"), str(venv / "bin" / "xfmr")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _, times["pip install torch==2.13.0"] = _run([*pip, "torch==2.13.0"], work, env, 900)
    _, times["pip install the kit[test]"] = _run([*pip, f"{built.wheel}[test]"], work, env, 900)
    where, _ = _run(
        [py, "-c", "import harness, oracle.ops; print(harness.__file__, oracle.ops.__file__)"],
        work,
        env,
        120,
    )
    assert str(ROOT) not in where and str(venv) in where and "ops.pyc" in where
    missing = subprocess.run(
        [py, "-c", "import impl.transformer"], cwd=work, env=env, capture_output=True
    )
    assert missing.returncode != 0  # the reference is not importable there

    out, times["xfmr start"] = _run([xfmr, "start", "mywork"], work, env, 120)
    shutil.copyfile(ROOT / "examples" / "correct_submission.py", work / "correct.py")
    out, times["xfmr check (canary, then 19 tests)"] = _run(
        [xfmr, "check", "correct.py"], work, env, 600
    )
    assert "Score: 122/122" in out, out
    out, times["xfmr check (canary kept)"] = _run([xfmr, "check", "correct.py"], work, env, 600)
    assert "Score: 122/122" in out, out
    out, times["pytest --xfmr"] = _run(
        [py, "-m", "pytest", "--xfmr", "correct.py", "-q", "-p", "no:cacheprovider"], work, env, 600
    )
    assert "19 passed" in out, out
    out, times["xfmr diff"] = _run([xfmr, "diff", "correct.py"], work, env, 600)
    assert "not in the student kit" in out, out
    out, times["xfmr milestone --smoke"] = _run(
        [xfmr, "milestone", "--submission", "correct.py", "--smoke"], work, env, 900
    )
    assert "met" in out, out
    refused = subprocess.run([xfmr, "matrix"], cwd=work, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "staff command" in refused.stderr
    print("\nthe kit in a fresh venv (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
