"""`xfmr start [DIR]`: a student's starting folder, generated from the contract.

- `transformer.py`: every class and function of impl/contract.pyi with its signature and types,
  the contract's clause for it (CONTRACT.md) as its docstring, and a body that raises
  NotImplementedError(NAME). The shared tests report such a test as "not implemented: NAME",
  and each test turns green as soon as what it calls is implemented.
- `tests/`: a conftest and one example test that takes the implementation as the fixture
  `transformer` (what `pytest --xfmr` and the grader's mutation score give a suite).
- `README.md`: the commands of the course's workflow, in order.

Nothing is ever overwritten: a file already there stops the command (exit 2) before it writes
anything. The stub is generated at each call from the contract, so a change of the contract
changes it (tests/harness_tests/students/test_start.py holds the two in sync).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

from harness.isolation.sandbox import PROJECT_ROOT

CONTRACT_PYI = PROJECT_ROOT / "impl" / "contract.pyi"
CONTRACT_MD = PROJECT_ROOT / "CONTRACT.md"
STUB = "transformer.py"
TESTS = "tests"
WIDTH = 88  # the stub's signatures are wrapped to this width (ruff's default line length)
# pytest --xfmr and check --suite need pytest and Hypothesis: the [test] extra (pyproject.toml)
TEST_EXTRA = "pip install 'xfmr-oracle[test]' (a checkout: pip install -e '.[test]')"

# The validation the contract's bad-input table asks of the config (impl checks it in
# __post_init__): a definition of the stub the contract does not name, stubbed like the others.
CONFIG_CHECK = (
    "The config's own checks (CONTRACT.md, Bad input): `norm` not 'post' or 'pre', or\n"
    "`d_model` not divisible by `n_heads`, raise ValueError. Delete the raise below once done."
)


# --- the contract's clauses -------------------------------------------------------------------


def _sections(md: str) -> dict[str, str]:
    """CONTRACT.md's `## ` sections by heading (the heading's first word: TransformerConfig,
    Transformer(cfg):, Functions, Bad)."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", md, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        out[heading.split()[0].rstrip(":")] = body.strip("\n")
    return out


def _bullets(text: str) -> tuple[list[str], str]:
    """The top-level `- ` items of a markdown text, each with its indented continuation (code
    blocks included), and the text that is in no item."""
    items: list[list[str]] = []
    rest: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("- "):
            current = [line]
            items.append(current)
        elif current is not None and (line.startswith(" ") or not line.strip()):
            current.append(line)
        else:
            current = None
            rest.append(line)
    return ["\n".join(i).strip() for i in items], "\n".join(rest).strip()


def _named(bullet: str, anywhere: bool = False) -> list[str]:
    """The definitions a bullet specifies: the code spans that open it or follow a `; `
    (`init_state(...)`; `decode_step(...)` names both); anywhere: every call it shows."""
    if anywhere:
        return re.findall(r"`([A-Za-z_]\w*)\(", bullet)
    return re.findall(r"(?:^- |; )`([A-Za-z_]\w*)\(", bullet.split("\n")[0])


def _specify(out: dict[str, str], bullets: list[str], prefix: str = "") -> None:
    """Each bullet's clause for the definitions it opens with, then for those it only mentions
    (`load_transformer` within save_transformer's)."""
    for anywhere in (False, True):
        for bullet in bullets:
            for name in _named(bullet, anywhere):
                out.setdefault(prefix + name, _unbullet(bullet))


def clauses(md: str | None = None) -> dict[str, str]:
    """The contract's clause for each definition: `TransformerConfig`, `Transformer` (the
    class), `Transformer.NAME` (its methods) and each function; `module` is the bad-input table
    every entry point honours."""
    md = CONTRACT_MD.read_text() if md is None else md
    sections = _sections(md)
    out: dict[str, str] = {"TransformerConfig": sections["TransformerConfig"]}
    model = sections["Transformer(cfg)"]
    intro, _, rest = model.partition("### The computation")
    computation, _, names = rest.partition("### state_dict names")
    bullets, kept = _bullets(intro)
    _specify(out, bullets, "Transformer.")
    out["Transformer"] = "\n\n".join(
        ["A torch.nn.Module with `.cfg` (CONTRACT.md, Transformer(cfg)).", kept]
        + ["The computation" + computation.rstrip()]
    )
    out["Transformer.__init__"] = (
        "Build the model of `cfg` (call torch.nn.Module's __init__ first; keep `cfg` as\n"
        "self.cfg), its parameters under the contract's state_dict names.\n\n"
        "state_dict names" + names.rstrip()
    )
    _specify(out, _bullets(sections["Functions"])[0])
    out["module"] = "Bad input (CONTRACT.md):\n\n" + sections["Bad"].rstrip()
    return out


def _unbullet(bullet: str) -> str:
    """A bullet's text without its marker and its two-space continuation indent."""
    lines = bullet.removeprefix("- ").splitlines()
    return "\n".join([lines[0], *(line.removeprefix("  ") for line in lines[1:])])


# --- the stub ---------------------------------------------------------------------------------


def _docstring(text: str, indent: str) -> str:
    """A triple-quoted docstring holding `text` exactly (backslashes and quotes escaped)."""
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').strip()
    lines = body.splitlines()
    if len(lines) == 1 and len(indent) + len(body) + 6 <= WIDTH:
        return f'{indent}"""{body}"""'
    inner = [f"{indent}{line}".rstrip() for line in lines]
    return "\n".join([f'{indent}"""{inner[0].strip()}', *inner[1:], f'{indent}"""'])


def _arguments(args: ast.arguments) -> list[str]:
    """Each parameter of a signature as written (annotation and default), markers included."""
    plain = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(plain) - len(args.defaults))
    defaults += list(args.defaults)

    def one(a: ast.arg, default: ast.expr | None) -> str:
        text = a.arg + (f": {ast.unparse(a.annotation)}" if a.annotation else "")
        if default is not None:
            text += f" = {ast.unparse(default)}" if a.annotation else f"={ast.unparse(default)}"
        return text

    out = [one(a, d) for a, d in zip(plain, defaults, strict=True)]
    if args.posonlyargs:
        out.insert(len(args.posonlyargs), "/")
    if args.vararg:
        out.append("*" + one(args.vararg, None))
    elif args.kwonlyargs:
        out.append("*")
    out += [one(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        out.append("**" + one(args.kwarg, None))
    return out


def signature(fn: ast.FunctionDef, indent: str = "") -> str:
    """`def NAME(...) -> R:` as the contract writes it, wrapped one parameter a line where one
    line would pass WIDTH."""
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    params = _arguments(fn.args)
    line = f"{indent}def {fn.name}({', '.join(params)}){returns}:"
    if len(line) <= WIDTH:
        return line
    inner = [f"{indent}    {p}," for p in params]
    return "\n".join([f"{indent}def {fn.name}(", *inner, f"{indent}){returns}:"])


def _trailing_comment(source_lines: list[str], node: ast.stmt) -> str:
    """The comment after a definition's last line in contract.pyi (`# [B, S, d]`), if any."""
    line = source_lines[(node.end_lineno or node.lineno) - 1]
    return line.split("#", 1)[1].strip() if "#" in line else ""


def _function(
    fn: ast.FunctionDef, name: str, clause: str, note: str, indent: str = ""
) -> list[str]:
    doc = clause + (f"\n\nReturns (contract.pyi): {note}" if note else "")
    return [
        signature(fn, indent),
        _docstring(doc, indent + "    "),
        f'{indent}    raise NotImplementedError("{name}")',
    ]


def stub(pyi: str | None = None, md: str | None = None) -> str:
    """The student's transformer.py, from contract.pyi and CONTRACT.md's clauses (KeyError: a
    definition of the contract without a clause in CONTRACT.md)."""
    pyi = CONTRACT_PYI.read_text() if pyi is None else pyi
    said = clauses(md)
    source_lines = pyi.splitlines()
    tree = ast.parse(pyi)
    out = [
        _docstring(
            "Your Transformer: every definition of the contract (impl/contract.pyi, CONTRACT.md),\n"
            "generated by `xfmr start`. Replace each `raise NotImplementedError` with your\n"
            "code; the shared tests go green one by one (`xfmr check transformer.py`).\n\n"
            "Every entry point (encode, decode, forward, init_state, decode_step, fit,\n"
            "translate) checks what reaches it:\n\n" + said["module"],
            "",
        ),
        "",
        "from __future__ import annotations",
        "",
    ]
    body = [n for n in tree.body if not isinstance(n, ast.Expr)]
    imports = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
    if imports:  # contract.pyi's import block as it is (its grouping kept)
        last = imports[-1].end_lineno or imports[-1].lineno
        out += source_lines[imports[0].lineno - 1 : last]
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        out += ["", ""]
        if isinstance(node, ast.FunctionDef):
            note = _trailing_comment(source_lines, node)
            out += _function(node, node.name, said[node.name], note)
        elif isinstance(node, ast.ClassDef) and node.decorator_list:  # the config dataclass
            segment = ast.get_source_segment(pyi, node, padded=True) or ast.unparse(node)
            header, _, fields = segment.partition(":\n")
            out += [f"@{ast.unparse(d)}" for d in node.decorator_list]
            out += [header + ":", _docstring(said[node.name], "    "), "", fields.rstrip(), ""]
            check = ast.parse("def __post_init__(self) -> None: ...").body[0]
            assert isinstance(check, ast.FunctionDef)
            out += _function(check, f"{node.name}.__post_init__", CONFIG_CHECK, "", "    ")
        elif isinstance(node, ast.ClassDef):
            out += [
                f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)}):",
                _docstring(said[node.name], "    "),
            ]
            for member in node.body:
                out.append("")
                if isinstance(member, ast.FunctionDef):
                    name = f"{node.name}.{member.name}"
                    note = _trailing_comment(source_lines, member)
                    out += _function(member, name, said[name], note, "    ")
                else:
                    out.append("    " + (ast.get_source_segment(pyi, member) or ""))
        else:  # an alias (DecodeState = Any: yours to choose), its comment above it
            if comment := _trailing_comment(source_lines, node):
                out.append(f"# {comment}")
            out.append(ast.unparse(node))
    return "\n".join(out).rstrip() + "\n"


# --- the tests folder and the README ----------------------------------------------------------

CONFTEST = '''"""Your own tests of your transformer.py.

Run them with `pytest --xfmr=transformer.py transformer.py tests/` (the implementation
named again among the paths runs the shared tests beside yours): the plugin gives every test the
fixture `transformer` (your module; the grader's mutation score gives a suite the same
fixture, each mutant of the reference in its place) and makes it importable as
tinyllm.xfmr.transformer. Do not define a fixture named `transformer` here: it would
hide the one the grader gives.
"""

import importlib.util
import os
import sys

import pytest


@pytest.fixture
def tiny_config():
    """The contract's config fields for a model small enough to run in milliseconds."""
    return dict(
        src_vocab=11, tgt_vocab=11, d_model=16, n_heads=2, d_ff=32, n_enc=1, n_dec=1
    )


# --xfmr is xfmr-oracle's pytest plugin. A pytest that has not loaded it would stop at
# "unrecognized arguments: --xfmr"; these two hooks say why instead (nothing else).
XFMR_OPTIONS = {
    "--xfmr": "xfmr",
    "--xfmr-module": "xfmr_module",
    "--xfmr-tests": "xfmr_tests",
}
TEST_EXTRA = "@TEST_EXTRA@"


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.has_plugin("xfmr"):
        for option in XFMR_OPTIONS:
            parser.addoption(option, help="(xfmr-oracle's plugin is not loaded)")


def pytest_configure(config):
    plugins = config.pluginmanager
    if plugins.has_plugin("xfmr"):
        return
    if not any(config.getoption(dest, None) for dest in XFMR_OPTIONS.values()):
        return
    try:
        installed = bool(importlib.util.find_spec("harness.students.pytest_plugin"))
    except ImportError:
        installed = False
    if plugins.is_blocked("xfmr"):
        why = "it is turned off here (-p no:xfmr): leave that out"
    elif installed and os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        why = "PYTEST_DISABLE_PLUGIN_AUTOLOAD is set: add -p xfmr"
    elif installed:
        why = (
            "xfmr-oracle is importable here, but pytest did not load its plugin:\\n"
            f"  add -p harness.students.pytest_plugin, or reinstall it: {TEST_EXTRA}"
        )
    else:
        why = (
            f"this pytest runs on {sys.executable},\\n"
            "  where xfmr-oracle is not installed. Install pytest beside xfmr-oracle,\\n"
            f"  its [test] extra: {TEST_EXTRA};\\n"
            "  then run that environment's pytest (python -m pytest)"
        )
    said = "this pytest has not loaded xfmr-oracle's plugin"
    raise pytest.UsageError(f"--xfmr: {said}:\\n  {why}")
'''.replace('"@TEST_EXTRA@"', repr(TEST_EXTRA))

EXAMPLE_TEST = '''"""Example tests: two clauses of the contract (CONTRACT.md), checked by hand.

A good test states one property that every correct implementation has and a wrong one
lacks; `xfmr check --suite tests/` counts how many of the course's pitfall mutants your
tests catch.
"""

import pytest


def test_noam_rate_at_the_first_update(transformer):
    # d = 16, warmup 4, n = 1: 16^-1/2 * min(1^-1/2, 1 * 4^-3/2) = 0.25 * 0.125
    assert transformer.noam_rate(0, 16, 4) == pytest.approx(0.03125, rel=1e-12)


def test_config_rejects_an_unknown_norm(transformer, tiny_config):
    with pytest.raises(ValueError):
        transformer.TransformerConfig(**tiny_config, norm="middle")
'''

README = """# Your Transformer

`transformer.py` holds every definition of the contract with its clause as its docstring; each
body raises NotImplementedError until you write it. Your own tests go in `tests/`.

1. `xfmr check transformer.py`: the course's shared tests on your code (a self-check, no
   sandbox). An unwritten definition fails its tests with "not implemented: NAME"; each test
   passes as soon as what it needs works (write noam_rate first: test_hand_example_noam).
2. `pytest --xfmr=transformer.py`: the same tests as pytest items; with paths, name your
   file among them to run both (`pytest --xfmr=transformer.py transformer.py tests/`).
   pytest and Hypothesis come with xfmr-oracle's `[test]` extra: `pip install
   'xfmr-oracle[test]'` (a checkout: `pip install -e '.[test]'`).
3. `xfmr check --suite tests/`: the mutation grade of your tests (how many of the course's
   pitfall mutants they catch; it needs the `[test]` extra too).
4. `xfmr milestone --submission transformer.py --smoke`: your own model trained on reversed
   addition, its translations, and the LayerNorm demo (post-LN vs pre-LN without warmup);
   without --smoke, the full milestone MS-L5 (exact match 0.98 on held-out sums).
5. `xfmr diff transformer.py`: once every shared test passes, your code beside the reference,
   definition by definition (`--html diff.html` for a side-by-side page).

The contract: CONTRACT.md of xfmr-oracle (`xfmr start` copied its clauses into the docstrings).
"""


def files() -> dict[str, str]:
    """Every file `xfmr start` writes, by its path inside the folder."""
    return {
        STUB: stub(),
        f"{TESTS}/conftest.py": CONFTEST,
        f"{TESTS}/test_transformer.py": EXAMPLE_TEST,
        "README.md": README,
    }


def start(folder: Path) -> list[Path]:
    """Write the starting files into `folder`; FileExistsError naming every file already there
    (nothing is written then)."""
    planned = {folder / name: text for name, text in files().items()}
    there = [p for p in planned if p.exists() or p.is_symlink()]
    if there:
        raise FileExistsError(
            f"{', '.join(str(p) for p in there)} already exist{'s' if len(there) == 1 else ''}: "
            "xfmr start never overwrites a file (move them away, or start in another folder)"
        )
    for path, text in planned.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x") as f:  # "x": a file that appeared meanwhile is not overwritten
            f.write(text)
    return list(planned)


def configure_start(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write your starting folder: transformer.py (every definition of the contract, its "
        "clause as the docstring, raising NotImplementedError), tests/ (a conftest and an "
        "example test) and a README with the commands to run next. Never overwrites a file."
    )
    parser.epilog = "exit status: 0 written; 2 nothing written (a file is already there)"
    parser.add_argument("dir", nargs="?", default=".", help="the folder to write into (.)")


def run_start(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    if folder.exists() and not folder.is_dir():
        print(f"xfmr start: {folder} is not a folder; nothing written", file=sys.stderr)
        return 2
    try:
        written = start(folder)
    except (FileExistsError, OSError) as e:
        print(f"xfmr start: {e}; nothing written", file=sys.stderr)
        return 2
    stub_path, tests = folder / STUB, folder / TESTS
    print("\n".join(f"wrote {p}" for p in written))
    steps = [
        (f"xfmr check {stub_path}", "the shared tests on your code"),
        (f"pytest --xfmr={stub_path} {stub_path} {tests}/", "the same, and your own tests *"),
        (f"xfmr check --suite {tests}/", "the mutation grade of your tests *"),
        (f"xfmr milestone --submission {stub_path} --smoke", "train your model, the LN demo"),
        (f"xfmr diff {stub_path}", "after a full pass: beside the reference"),
    ]
    width = max(len(command) for command, _ in steps)
    print(
        f"\nYour code goes in {stub_path}; your own tests go in {tests}/ (pytest files; each "
        "test takes your module as the fixture `transformer`). See README.md there.\nNext:"
    )
    print("\n".join(f"  {command:<{width}}  # {what}" for command, what in steps))
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    here = f" ({' and '.join(missing)} not installed here)" if missing else ""
    print(f"* needs pytest and Hypothesis, xfmr-oracle's [test] extra{here}: {TEST_EXTRA}")
    return 0
