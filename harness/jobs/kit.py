"""`xfmr kit --out DIR`: the student kit, a wheel of the students' commands without the reference.

What a student installs instead of the project (`pip install -e .` put impl, the mutants and the
oracle, the numpy forward pass the course asks students to write, on their disk as source). The
wheel carries `xfmr start`, `check` (and `--suite`), `diff`, `milestone --submission` and the
pytest plugin (`pytest --xfmr`), and of the reference only:
- oracle/ and the mutants' catalogs as sourceless bytecode (`.pyc` where the `.py` would be,
  which CPython imports without source), compiled here from a copy of their syntax tree whose
  docstrings are dropped and whose string constants (the mutants' patches) are one sealed blob
  per module (harness.sealed: zlib and a fixed xor, read back when the module is imported);
- impl/transformer.py, impl/torch_copy.py and mutants/generated_catalog.json as one sealed blob
  (harness/data/reference.sealed): the canary's known-correct subject and the subjects of
  `xfmr check --suite`, written out only into a worker's private staging folder.
Left out: the course's measurements (harness/tools/), `xfmr smoke` (it imports impl), the fault
catalog of the diagnosis tests (mutants/student_faults.py), the smoke sweep, the matrix's
expectation and the simulated container's driver. The staff commands that stay in the wheel
(their modules are the students' commands' dependencies) refuse in the kit (harness.sealed).

Before it writes anything the build searches every source and data file it would ship for the
reference's distinctive lines (reference_lines) and refuses, naming file and line, if one is
there. Sealing is not encryption: a student who runs or disassembles the kit can recover all of
it (README: what a determined student can still recover). Bytecode ties the wheel to the
interpreter that built it: tagged cpXY-none-any with Requires-Python ==X.Y.*, and the kit's
commands refuse on any other interpreter.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import importlib.util
import json
import marshal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from harness import sealed
from harness.options import usage_error

ROOT = sealed.PROJECT_ROOT
# the commands the kit offers (cli.SECTIONS' "your own code"), beside the pytest plugin
COMMANDS = ("start", "check", "diff", "milestone")
# the texts the students' commands need as text: sealed into harness/data/reference.sealed
SEALED_TEXTS = ("impl/transformer.py", "impl/torch_copy.py", "mutants/generated_catalog.json")
# modules that hold reference: shipped as sourceless bytecode with sealed strings
SEALED_MODULES = (
    "oracle/",
    "mutants/catalog.py",
    "mutants/generated.py",
    "mutants/generated_catalog.py",
)
# never in the wheel as a file of their own
LEFT_OUT = (
    "impl/transformer.py",  # the reference (sealed text only)
    "impl/torch_copy.py",  # a full correct implementation too (sealed text only)
    "mutants/student_faults.py",  # the diagnosis tests' fault catalog: no student command reads it
    "mutants/generated_catalog.json",  # sealed text only
    "harness/tools/",  # the course's measurements (detection.py, bench_engine.py quote impl)
    "harness/oracle_checks/smoke.py",  # `xfmr smoke` compares impl with the oracle
    "demos/smoke_sweep.py",  # the smoke bar's sweep over correct subjects and mutants (staff)
    "harness/data/expected_matrix.json",  # the matrix's expectation (staff)
    "harness/data/kit.json",  # written fresh for each kit
    "harness/data/reference.sealed",  # written fresh for each kit
    "harness/jobs/kit.py",  # this builder (staff)
)
PACKAGES = ("harness", "oracle", "impl", "mutants", "tasks", "demos")
# files beside the modules that the students' commands read, by their path in the project
FILES = ("CONTRACT.md", "impl/contract.pyi", "harness/data/learning_bar.json")
# what the students' commands import beyond the standard library: [project]'s dependencies less
# pyseccomp, which only the grader's sandbox uses (pandas: the reports that `xfmr check` shares
# with the grade)
REQUIRES = ("numpy", "torch", "safetensors", "pandas")
EXTRAS = {"test": ("pytest", "hypothesis"), "plots": ("matplotlib",)}
NAME = "__xfmr_strings__"  # a sealed module's global: its string constants, unsealed at import
MIN_LINE = 24  # a reference line shorter than this is not distinctive

# Lines of the reference that the harness's own code also writes: generic idioms of numpy and
# torch code and calls of the contract's API, reviewed one by one; no evidence of reference
# text. A line that is not here and is in a shipped source file stops the build.
IDIOMS = frozenset(
    {
        "def __post_init__(self) -> None:",
        "@contextlib.contextmanager",
        "state = model.init_state(src_mask)",
        "memory = model.encode(src, src_mask)",
        "if isinstance(x, np.ndarray):",
        "if isinstance(x, (tuple, list)):",
        "spec = dataclasses.replace(",
        'TABLES = ("src_emb.weight", "tgt_emb.weight", "out.weight")',
        'raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")',
        "if dtype not in PRECISIONS:",
        "rng = np.random.default_rng(seed)",
        "trace: dict[str, np.ndarray]",
        "for i in range(spec.n_dec):",
        "for i in range(spec.n_enc):",
        "for i in range(spec.n_dec)",
        ") -> tuple[np.ndarray, np.ndarray]:",
        "for _ in range(max_len):",
        "p: dict[str, np.ndarray],",
        "betas: tuple[float, float] = BETAS,",
        'for stack in ("encoder", "decoder"):',
        'if path.suffix == ".safetensors":',
        ") -> tuple[float, float]:",
        "score: float | None = None",
        "model.train(was_training)",
        "was_training = model.training",
        "losses: list[float] = []",
        "for group in optimizer.param_groups:",
    }
)


class KitError(Exception):
    """The kit cannot be built as it must be (a file would carry reference text, a wrong
    interpreter); nothing was written."""


@dataclass(frozen=True)
class Entry:
    """One file of the wheel: its path there and its bytes, and how it got them."""

    path: str
    data: bytes
    how: str  # "source", "sealed bytecode", "file", "sealed texts", "metadata"


# --- what the reference is --------------------------------------------------------------------


def _lines(text: str) -> set[str]:
    return {s for line in text.splitlines() if len(s := line.strip()) >= MIN_LINE}


def reference_lines(root: Path = ROOT) -> set[str]:
    """The reference's distinctive lines: every line of at least MIN_LINE characters of impl,
    the torch copy, the oracle and every mutant's patches and appended code (the pitfalls', the
    generated ones', the students' faults'), less the contract's own lines (CONTRACT.md,
    impl/contract.pyi: public), imports and IDIOMS."""
    found: set[str] = set()
    for rel in ("impl/transformer.py", "impl/torch_copy.py"):
        found |= _lines((root / rel).read_text())
    for path in sorted((root / "oracle").rglob("*.py")):
        found |= _lines(path.read_text())
    for text in mutant_texts():
        found |= _lines(text)
    public = (root / "CONTRACT.md").read_text() + (root / "impl" / "contract.pyi").read_text()
    return {
        line
        for line in found
        if line not in public and line not in IDIOMS and not line.startswith(("import ", "from "))
    }


def mutant_texts() -> list[str]:
    """Every patch's old and new text and every appended code of the project's mutants (the
    running project's: the catalogs are read by importing them)."""
    from mutants import catalog, generated_catalog, student_faults

    mutants = [*catalog.MUTANTS, *generated_catalog.load()]
    mutants += [m for fault in student_faults.FAULTS for m in fault.plants.values()]
    out: list[str] = []
    for m in mutants:
        out += [t for p in m.patches for t in (p.old, p.new)]
        out += [m.append] if m.append else []
    return out


# --- sealed bytecode --------------------------------------------------------------------------


_Def = TypeVar("_Def", ast.FunctionDef, ast.AsyncFunctionDef)


class _Sealer(ast.NodeTransformer):
    """A module's syntax tree with its docstrings dropped and every string constant outside
    annotations and match patterns read from NAME[i] (its strings, sealed)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def _ref(self, value: str, like: ast.AST) -> ast.expr:
        i = self._index.setdefault(value, len(self.values))
        if i == len(self.values):
            self.values.append(value)
        ref = ast.Subscript(ast.Name(NAME, ast.Load()), ast.Constant(i), ast.Load())
        return ast.copy_location(ref, like)

    @staticmethod
    def _undoc(body: list[ast.stmt]) -> list[ast.stmt]:
        first = body[0] if body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            body = body[1:] or [ast.copy_location(ast.Pass(), first)]
        return body

    def visit_Constant(self, node: ast.Constant) -> ast.expr:
        return self._ref(node.value, node) if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.JoinedStr:
        parts: list[ast.expr] = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(ast.copy_location(ast.FormattedValue(self._ref(v.value, v), -1), v))
            else:
                parts.append(self.visit(v))
        node.values = parts
        return node

    def visit_FormattedValue(self, node: ast.FormattedValue) -> ast.FormattedValue:
        node.value = self.visit(node.value)  # the format spec (".3f") is left as written
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return node  # annotations are left as written

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.target = self.visit(node.target)
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        return self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AsyncFunctionDef:
        return self._function(node)

    def _function(self, node: _Def) -> _Def:
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        node.body = [self.visit(s) for s in self._undoc(node.body)]
        return node  # the return annotation is left as written

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.body = self._undoc(node.body)
        self.generic_visit(node)
        return node

    def visit_match_case(self, node: ast.match_case) -> ast.match_case:
        if node.guard is not None:
            node.guard = self.visit(node.guard)
        node.body = [self.visit(s) for s in node.body]
        return node  # patterns must stay constants


def sealed_code(source: str, filename: str) -> bytes:
    """`source` compiled as a sourceless .pyc: its docstrings dropped, its string constants
    one sealed blob unsealed into NAME when the module is imported."""
    tree = ast.parse(source, filename)
    sealer = _Sealer()
    body = [sealer.visit(s) for s in _Sealer._undoc(tree.body)]
    futures = 0
    while futures < len(body) and _is_future(body[futures]):
        futures += 1
    prelude = ast.parse(
        f"{NAME} = __import__('harness.sealed', fromlist=['strings']).strings("
        f"{sealed.seal_strings(sealer.values)!r})"
    ).body
    tree.body = body[:futures] + prelude + body[futures:]
    code = compile(ast.fix_missing_locations(tree), filename, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + bytes(12)  # flags 0, no timestamp or size: no source
    return header + marshal.dumps(code)


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


# --- the plan ---------------------------------------------------------------------------------


def _matches(rel: str, prefixes: Iterable[str]) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)


def package_files(root: Path = ROOT) -> Iterator[str]:
    """Every .py file of the project's packages, by its path from the root."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path.relative_to(root).as_posix()


def entries(root: Path = ROOT) -> tuple[list[Entry], list[str]]:
    """The wheel's files (metadata aside) and the project files left out of it."""
    out: list[Entry] = []
    left: list[str] = []
    for rel in package_files(root):
        if _matches(rel, LEFT_OUT):
            left.append(rel)
        elif _matches(rel, SEALED_MODULES):
            code = sealed_code((root / rel).read_text(), rel)
            out.append(Entry(rel.removesuffix(".py") + ".pyc", code, "sealed bytecode"))
        else:
            out.append(Entry(rel, (root / rel).read_bytes(), "source"))
    out += [Entry(rel, (root / rel).read_bytes(), "file") for rel in FILES]
    texts = {rel: (root / rel).read_text() for rel in SEALED_TEXTS}
    out.append(
        Entry(
            sealed.BLOB.relative_to(ROOT).as_posix(),
            sealed.seal(json.dumps(texts).encode()),
            "sealed texts",
        )
    )
    return out, left


def leaks(files: Iterable[Entry], lines: set[str]) -> list[str]:
    """'path: line' for every distinctive reference line in a file shipped as text."""
    found = []
    for e in files:
        if e.how in ("source", "file"):
            text = e.data.decode("utf-8", "replace")
            found += [f"{e.path}: {line}" for line in sorted(lines) if line in text]
    return found


# --- the wheel --------------------------------------------------------------------------------


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pinned(wanted: Iterable[str], given: Iterable[str]) -> list[str]:
    """The requirement strings of `given` (pyproject's) whose package is one of `wanted`."""
    given = list(given)
    out = []
    for name in wanted:
        found = [g for g in given if g.split(";")[0].strip().startswith(name)]
        out.append(found[0].split(";")[0].strip() if found else name)
    return out


def tag() -> str:
    return f"cp{sys.version_info[0]}{sys.version_info[1]}-none-any"


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def metadata(version: str) -> list[Entry]:
    project = _project()
    info = f"xfmr_oracle-{version}.dist-info"
    major, minor = sys.version_info[:2]
    meta = [
        "Metadata-Version: 2.1",
        "Name: xfmr-oracle",
        f"Version: {version}",
        "Summary: the xfmr-oracle student kit: xfmr start, check, diff, milestone --submission "
        "and pytest --xfmr, without the reference",
        f"Requires-Python: =={major}.{minor}.*",
    ]
    meta += [f"Requires-Dist: {r}" for r in _pinned(REQUIRES, project["dependencies"])]
    extras = project["optional-dependencies"]
    for extra, names in EXTRAS.items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r}; extra == "{extra}"' for r in _pinned(names, extras[extra])]
    wheel = ["Wheel-Version: 1.0", "Generator: xfmr kit", "Root-Is-Purelib: true", f"Tag: {tag()}"]
    points = ["[console_scripts]"]
    points += [f"{k} = {v}" for k, v in project["scripts"].items()]
    for group, found in project["entry-points"].items():
        points += ["", f"[{group}]", *(f"{k} = {v}" for k, v in found.items())]
    return [
        Entry(f"{info}/METADATA", ("\n".join(meta) + "\n").encode(), "metadata"),
        Entry(f"{info}/WHEEL", ("\n".join(wheel) + "\n").encode(), "metadata"),
        Entry(f"{info}/entry_points.txt", ("\n".join(points) + "\n").encode(), "metadata"),
        Entry(f"{info}/top_level.txt", ("\n".join(PACKAGES) + "\n").encode(), "metadata"),
    ]


def _record_line(e: Entry) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(e.data).digest()).rstrip(b"=").decode()
    return f"{e.path},sha256={digest},{len(e.data)}"


@dataclass(frozen=True)
class Kit:
    wheel: Path
    install: Path
    files: list[Entry]
    left_out: list[str]


def build(out: Path) -> Kit:
    """Write the kit into `out`: the wheel and INSTALL.txt. KitError (nothing written) where
    the interpreter is not CPython or a shipped file would carry a reference line."""
    if sys.implementation.name != "cpython":
        raise KitError(
            f"the kit's bytecode is CPython's: build it with CPython, not {sealed.interpreter()}"
        )
    files, left = entries()
    if found := leaks(files, reference_lines()):
        raise KitError(
            "these shipped files hold lines of the reference (seal the module in "
            "harness.jobs.kit.SEALED_MODULES, leave it out in LEFT_OUT, or, for a generic "
            "idiom, add it to IDIOMS):\n  " + "\n  ".join(found)
        )
    version = f"{_project()['version']}+kit"
    built = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from harness.cli import COMMANDS as modules_and_help

    modules = {name: module for name, (module, _) in modules_and_help.items()}
    manifest = {
        "interpreter": sealed.interpreter(),
        "commands": {name: modules[name] for name in COMMANDS},
        "commit": commit(),
        "built": built,
    }
    rel = sealed.MANIFEST.relative_to(ROOT).as_posix()
    files.append(Entry(rel, (json.dumps(manifest, indent=1) + "\n").encode(), "file"))
    files += metadata(version)
    record = f"xfmr_oracle-{version}.dist-info/RECORD"
    lines = [_record_line(e) for e in files] + [f"{record},,"]
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"xfmr_oracle-{version}-{tag()}.whl"
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for e in files:
            z.writestr(zipfile.ZipInfo(e.path, (1980, 1, 1, 0, 0, 0)), e.data, zipfile.ZIP_DEFLATED)
        z.writestr(record, "\n".join(lines) + "\n")
    partial.replace(wheel)
    install = out / "INSTALL.txt"
    install.write_text(INSTALL.format(wheel=wheel.name, **manifest))
    return Kit(wheel, install, files, left)


INSTALL = """xfmr-oracle student kit, built {built} from commit {commit}, for {interpreter}

It holds the course's commands for your own code: xfmr start, xfmr check (and --suite),
pytest --xfmr, xfmr milestone --submission and xfmr diff. It needs Python 3.11 (the
interpreter named above: the kit refuses any other) and torch.

  python3.11 -m venv xfmr-env
  . xfmr-env/bin/activate
  pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  pip install '{wheel}[test]'
  xfmr start mywork
  xfmr check mywork/transformer.py

(torch first, as its CPU build: smaller and faster to install; any torch from 2.2 on works.
[test] brings pytest and Hypothesis, for pytest --xfmr and xfmr check --suite.) Each command's
options: xfmr COMMAND --help.

The reference implementation is not in this kit as source: the course shows it to you where it
decides (the autograder, after every shared test passes). The grader's own checks run it, so its
code is in the kit sealed, not hidden: whoever takes the kit apart can read it, and that is not
how the course asks you to work.
"""


# --- xfmr kit ---------------------------------------------------------------------------------


def configure_kit(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build the student kit: a wheel of the students' commands (start, check, diff, "
        "milestone --submission, pytest --xfmr) without the reference's source, and "
        "INSTALL.txt. Hand both to the students; they install the wheel, never the project."
    )
    parser.epilog = (
        "exit status: 0 built; 2 bad options or the kit cannot be built (nothing written)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write into")


def run_kit(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return usage_error("kit", f"--out {out} is not a folder")
    try:
        kit = build(out)
    except (KitError, OSError) as e:
        print(f"xfmr kit: {e}; nothing written", file=sys.stderr)
        return 2
    counts: dict[str, int] = {}
    for entry in kit.files:
        counts[entry.how] = counts.get(entry.how, 0) + 1
    print(f"wrote {kit.wheel} ({kit.wheel.stat().st_size / 1e6:.2f} MB) and {kit.install}")
    print("  " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))
    print(f"  left out: {', '.join(kit.left_out)}")
    return 0
