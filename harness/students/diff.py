"""`xfmr diff SUBMISSION`: after every shared test passes, the student's code beside the
reference (impl/transformer.py), definition by definition in the contract's order.

The pass comes first: the shared tests are run as `xfmr check` runs them (the student's own
machine, no sandbox), or read from a grade JSON (`xfmr grade --json`, `xfmr check --json`) of
the same file, matched by its sha256. Before a full pass the command refuses and names the
tests that still fail: the reference is what a student reads after solving, never instead.

Definitions are matched by name (the contract's, then any helper of the same name), then by
what they implement: two helpers called from the same matched definition (impl's _beam_search
and a student's beam_search, both called by translate) are paired when their code is alike, and
any other pair only when it is much alike. What stays unpaired is listed as "yours only" or
"reference only". The terminal gets a unified diff per definition; `--html FILE` a side-by-side
page (difflib.HtmlDiff: every line of code escaped, every name and label escaped here). Both
compare code: comments, docstrings and blank lines are left out (`--as-written` keeps them), so
a student who wrote the reference's code in their own words sees no difference.

In the Gradescope autograder this is a course policy switch, off by default (`xfmr autograder
gradescope --reveal-reference-after-pass`): run_autograder then calls `xfmr diff --grade
grade.json --gradescope results.json`, which adds the diff to a full-score results.json as a
test of 0 points; any other results.json is left as it was. The student kit (`xfmr kit`) holds
no reference text: there, after a full pass, the command says where the course shows it.

A front end like harness.students.selfcheck (it runs the self-check's tests): nothing below
imports it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import html
import io
import json
import sys
import textwrap
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import grading
from harness.isolation.sandbox import PROJECT_ROOT
from harness.isolation.worker import printable
from harness.options import usage_error
from harness.records import Grade, TestResult
from harness.reports.grade import sha256_of
from harness.reports.gradescope import with_reference
from harness.reports.writer import report_path_problem, write_all
from harness.shared_tests.laws import SHARED_TESTS
from harness.students import selfcheck

REFERENCE = PROJECT_ROOT / "impl" / "transformer.py"
CONTRACT_PYI = PROJECT_ROOT / "impl" / "contract.pyi"
# a helper pair called from the same matched definition: alike enough at this ratio of equal
# tokens (difflib's; 0.2-0.3 paired unrelated helpers of the annotated example, a LayerNorm
# with a check); any other pair only when this alike
ALIKE_IN_CONTEXT = 0.35
ALIKE_ANYWHERE = 0.5
NAMED_ALIKE = 0.85  # two names this alike, case and underscores aside, are one definition


@dataclass(frozen=True)
class Unit:
    """One definition of a module: a top-level function or class, or a method of a class the
    contract splits (Transformer.encode)."""

    name: str
    source: str
    path: str
    line: int
    calls: frozenset[str]  # the names it reads (functions, attributes, classes)
    kind: str = "function"  # or "class"

    @property
    def short(self) -> str:
        return self.name.rpartition(".")[2]


def contract_order(pyi: Path = CONTRACT_PYI) -> list[str]:
    """The contract's definitions in its order: classes, the methods of a class with methods
    (Transformer.__init__, Transformer.encode, ...), functions."""
    out: list[str] = []
    for node in ast.parse(pyi.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            out.append(node.name)
        elif isinstance(node, ast.ClassDef):
            methods = [m.name for m in node.body if isinstance(m, ast.FunctionDef)]
            out += [f"{node.name}.{m}" for m in methods] if methods else [node.name]
    return out


def _split_classes(order: Iterable[str]) -> set[str]:
    return {name.partition(".")[0] for name in order if "." in name}


def units(source: str, path: str, split: set[str]) -> dict[str, Unit]:
    """The definitions of a module's source; the classes in `split` by method (the rest of such
    a class, its header and attributes, as the class's own unit)."""
    lines = source.splitlines()

    def unit(name: str, node: ast.stmt, text: str | None = None) -> Unit:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        body = text if text is not None else "\n".join(lines[first - 1 : node.end_lineno])
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        return Unit(name, body, path, first, frozenset(names), kind)

    out: dict[str, Unit] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = unit(node.name, node)
        elif isinstance(node, ast.ClassDef) and node.name in split:
            kept = [i for i in range(node.lineno, (node.end_lineno or node.lineno) + 1)]
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{node.name}.{member.name}"] = unit(f"{node.name}.{member.name}", member)
                    first = min([member.lineno, *(d.lineno for d in member.decorator_list)])
                    gone = set(range(first, (member.end_lineno or member.lineno) + 1))
                    kept = [i for i in kept if i not in gone]
            header = "\n".join(lines[i - 1] for i in kept).rstrip()
            out[node.name] = unit(node.name, node, header)
        elif isinstance(node, ast.ClassDef):
            out[node.name] = unit(node.name, node)
    return out


def _tokens(source: str) -> list[str]:
    """A definition's code as tokens: names, operators, numbers (comments, layout and the long
    strings of docstrings left out), so that formatting and prose do not count."""
    kept = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER) or (
                tok.type == tokenize.STRING and len(tok.string) <= 20
            ):
                kept.append(tok.string)
    except (tokenize.TokenError, SyntaxError):  # a class's header alone may not tokenize whole
        kept = source.split()
    return kept


def code_lines(source: str) -> list[str]:
    """A definition's lines as code: comments, docstrings and blank lines left out, common
    indentation removed, so that two definitions differing only in prose and layout compare
    equal (impl's commented TransformerConfig against a student's bare one)."""
    text = textwrap.dedent(source)
    lines = text.splitlines()
    cut: dict[int, int] = {}  # line (1-based) -> the column its comment starts at
    gone: set[int] = set()  # docstring lines
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                cut[tok.start[0]] = tok.start[1]
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (
                isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                gone.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # a split class's header alone may not parse: whole-line comments only
        cut = {i: len(x) - len(x.lstrip()) for i, x in enumerate(lines, 1) if x.lstrip()[:1] == "#"}
    kept = []
    for i, line in enumerate(lines, 1):
        if i in gone:
            continue
        line = line[: cut.get(i, len(line))].rstrip()
        if line:
            kept.append(line)
    return kept


def header(source: str) -> tuple[str, int, int] | None:
    """A definition's signature (a def's name, parameters, defaults and return annotation; a
    class's name, bases and keywords) as its AST, layout aside, and the lines it spans in the
    dedented source (first, last: 1-based, up to the line before the body); None when it cannot
    be read (a split class's header alone that does not parse) or has no line of its own."""
    try:
        node = ast.parse(textwrap.dedent(source)).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return None
    last = node.body[0].lineno - 1
    if last < node.lineno:  # `def f(x): return x`: the body on the header's line
        return None
    bare = copy.copy(node)  # the signature alone: no body, no decorators (lines of their own)
    bare.body, bare.decorator_list = [ast.Pass()], []
    return ast.dump(bare), node.lineno, last


def _same_headers(ref: str, mine: str) -> str:
    """`mine` with its signature's lines written as the reference's where the two signatures
    are the same AST (a def split over lines, other spacing, a trailing comma), so that layout
    alone is no difference; `mine` unchanged otherwise."""
    theirs, ours = header(ref), header(mine)
    if theirs is None or ours is None or theirs[0] != ours[0]:
        return mine
    ref_lines, my_lines = textwrap.dedent(ref).splitlines(), textwrap.dedent(mine).splitlines()
    spliced = my_lines[: ours[1] - 1] + ref_lines[theirs[1] - 1 : theirs[2]] + my_lines[ours[2] :]
    return "\n".join(spliced)


def _alike(a: Unit, b: Unit) -> float:
    """How alike two definitions' code is: difflib's ratio over their tokens."""
    return difflib.SequenceMatcher(None, _tokens(a.source), _tokens(b.source), False).ratio()


def _named_alike(a: Unit, b: Unit) -> float:
    """How alike two names are, case and underscores aside (_beam_search, beam_search: 1)."""
    left, right = (u.name.lower().replace("_", "") for u in (a, b))
    return difflib.SequenceMatcher(None, left, right).ratio()


@dataclass
class Matching:
    pairs: list[tuple[Unit | None, Unit | None, str]]  # (reference, yours, how matched)


def match(reference: dict[str, Unit], yours: dict[str, Unit], order: list[str]) -> Matching:
    """The contract's definitions in its order, each under its name; then helpers by name, then
    by what they implement (see the module's docstring); then each side's unpaired ones."""
    pairs: dict[str, str] = {}  # reference name -> yours
    how: dict[str, str] = {}
    for name in reference:
        if name in yours:
            pairs[name] = name
            how[name] = "contract" if name in order else "same name"
    while True:
        ref_left = [r for r in reference if r not in pairs and r not in order]
        your_left = [y for y in yours if y not in pairs.values() and y not in order]
        best: tuple[float, str, str, str] | None = None
        for r in ref_left:
            for y in your_left:
                shared = any(
                    reference[r].short in reference[p].calls and yours[y].short in yours[q].calls
                    for p, q in pairs.items()
                )
                ratio = _alike(reference[r], yours[y])
                named = _named_alike(reference[r], yours[y]) >= NAMED_ALIKE
                if reference[r].kind != yours[y].kind and not named:
                    continue  # a class and a function: one only where the names say so
                if named:
                    score, why = 2 + ratio, "a like name"
                elif shared and ratio >= ALIKE_IN_CONTEXT:
                    score, why = 1 + ratio, "called from the same definition"
                elif ratio >= ALIKE_ANYWHERE:
                    score, why = ratio, "alike"
                else:
                    continue
                if best is None or score > best[0]:
                    best = (score, r, y, f"{why}, {ratio:.0%} alike")
        if best is None:
            break
        _, r, y, said = best
        pairs[r], how[r] = y, said
    out: list[tuple[Unit | None, Unit | None, str]] = []
    for name in order:  # the contract's, even where one side lacks it
        if name in reference or name in yours:
            mine = yours.get(pairs.get(name, name))
            out.append((reference.get(name), mine, "contract" if mine else "missing in yours"))
    for r in reference:
        if r in pairs and r not in order:
            out.append((reference[r], yours[pairs[r]], how[r]))
    out += [(reference[r], None, "reference only") for r in reference if r not in pairs]
    taken = set(pairs.values())
    out += [(None, yours[y], "yours only") for y in yours if y not in taken and y not in order]
    return Matching(out)


# --- the pass that comes first ----------------------------------------------------------------


def _failing(tests: Iterable[TestResult]) -> list[str]:
    done = {t.name: t for t in tests}
    return [t.name for t in SHARED_TESTS if t.name not in done or not done[t.name].passed]


def failing_from_grade(report: Path, submission: Path) -> list[str] | str:
    """The shared tests a grade JSON says still fail on `submission` (every one it lacks among
    them), or why the report cannot be used."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError) as e:
        return f"--grade {report}: cannot be read ({e})"
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        return f"--grade {report}: not a grade JSON (xfmr grade --json or xfmr check --json)"
    want = sha256_of(submission)
    if not want:  # nothing hashable (a link, a special file, past the caps): run the tests
        return f"--grade {report}: {submission} cannot be hashed, so no grade can vouch for it"
    if data.get("sha256") != want:
        return (
            f"--grade {report} is the grade of another file (sha256 {data.get('sha256')!r}, "
            f"{submission} has {want}): grade this very file first"
        )
    try:
        tests = [TestResult.from_json(t) for t in data["tests"]]
    except (TypeError, ValueError, KeyError) as e:
        return f"--grade {report}: a test it holds cannot be read ({e})"
    if data.get("rejected"):
        return [t.name for t in SHARED_TESTS]
    return _failing(tests)


def failing_from_check(submission: Path) -> tuple[list[str], Grade]:
    """The shared tests that fail on `submission`, run as `xfmr check` runs them."""
    g = selfcheck.check(submission)
    return ([t.name for t in SHARED_TESTS] if g.rejected or g.error else _failing(g.tests)), g


# --- the diff ---------------------------------------------------------------------------------


def _student_units(submission: Path, split: set[str]) -> dict[str, Unit]:
    """The student's definitions: the main module's, then those of the folder's other modules
    (a contract name found in a helper module is found; a clash keeps the main module's)."""
    main = grading.submitted(submission)
    if main.is_dir():  # a package: its __init__.py, then its other modules
        others = sorted(p for p in main.glob("*.py") if p.stem != "__init__")
        files = [main / "__init__.py", *others]
    else:
        folder = grading.folder_of(submission, main)
        others = sorted(p for p in folder.glob("*.py") if p != main) if folder else []
        files = [main, *others]
    out: dict[str, Unit] = {}
    for file in files:
        try:
            found = units(file.read_text(), file.name, split)
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for name, unit in found.items():
            out.setdefault(name, unit)
    return out


def matching(submission: Path) -> Matching:
    order = contract_order()
    split = _split_classes(order)
    reference = units(REFERENCE.read_text(), "impl/transformer.py", split)
    return match(reference, _student_units(submission, split), order)


def _label(u: Unit | None, side: str) -> str:
    return f"{side}: {u.path}:{u.line} {u.name}" if u else f"{side}: (none)"


def _sides(ref: Unit | None, mine: Unit | None, as_written: bool) -> tuple[list[str], list[str]]:
    """Both definitions' lines: as code (comments, docstrings and blank lines aside; a
    signature that is the reference's AST in another layout written as the reference's) or as
    written."""
    if as_written:
        return (ref.source.splitlines() if ref else []), (mine.source.splitlines() if mine else [])
    if ref is None or mine is None:
        return (code_lines(ref.source) if ref else []), (code_lines(mine.source) if mine else [])
    return code_lines(ref.source), code_lines(_same_headers(ref.source, mine.source))


def text(m: Matching, as_written: bool = False) -> str:
    """A unified diff per definition (reference first, yours second), of the code alone unless
    `as_written`."""
    out: list[str] = []
    same = 0
    for ref, mine, how in m.pairs:
        name = (ref or mine).name if (ref or mine) else "?"  # type: ignore[union-attr]
        if mine is not None and ref is not None and mine.name != ref.name:
            name = f"{ref.name} ~ yours {mine.name}"
        left, right = _sides(ref, mine, as_written)
        diff = list(
            difflib.unified_diff(
                left, right, _label(ref, "reference"), _label(mine, "yours"), lineterm=""
            )
        )
        if not diff:
            same += 1
            out.append(f"== {printable(name)} ({how}): identical")
            continue
        out.append(f"== {printable(name)} ({how})")
        out += [printable(line) for line in diff]
        out.append("")
    aside = "" if as_written else " (comments, docstrings and blank lines aside)"
    out.append(f"{same} of {len(m.pairs)} definitions identical to the reference{aside}")
    return "\n".join(out) + "\n"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
table.diff {{ font-family: monospace; border-collapse: collapse; margin-bottom: 2em; }}
.diff_header {{ background: #e0e0e0; }} td.diff_header {{ text-align: right; }}
.diff_next {{ background: #c0c0c0; }} .diff_add {{ background: #aaffaa; }}
.diff_chg {{ background: #ffff77; }} .diff_sub {{ background: #ffaaaa; }}
</style></head><body>
<h1>{title}</h1>
<p>The reference (left) beside your code (right), definition by definition in the contract's
order; helpers matched by name, then by what they implement.</p>
{body}
</body></html>
"""


def page(m: Matching, submission: str, as_written: bool = False) -> str:
    """A side-by-side HTML page (of the code alone unless `as_written`): every name and label
    escaped here, every line of code by difflib.HtmlDiff (which escapes &, < and >)."""
    differ = difflib.HtmlDiff(tabsize=4, wrapcolumn=90)
    parts = []
    for ref, mine, how in m.pairs:
        name = (ref or mine).name if (ref or mine) else "?"  # type: ignore[union-attr]
        heading = html.escape(printable(f"{name} ({how})"))
        if mine is not None and ref is not None and mine.name != ref.name:
            heading = html.escape(printable(f"{ref.name} ~ yours {mine.name} ({how})"))
        left, right = _sides(ref, mine, as_written)
        table = differ.make_table(
            [printable(x) for x in left],
            [printable(x) for x in right],
            html.escape(printable(_label(ref, "reference"))),
            html.escape(printable(_label(mine, "yours"))),
            context=False,
        )
        parts.append(f"<h2>{heading}</h2>\n{table}")
    title = html.escape(printable(f"xfmr diff: {submission} beside the reference"))
    return PAGE.format(title=title, body="\n".join(parts))


# --- xfmr diff --------------------------------------------------------------------------------


def configure_diff(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "After every shared test passes on your transformer.py: your code beside the reference, "
        "definition by definition in the contract's order (a unified diff each; --html for a "
        "side-by-side page). Before that it refuses, naming the tests that still fail."
    )
    parser.epilog = (
        "exit status: 0 the diff was shown (in the student kit: where the course shows it); "
        "1 refused (some shared test still fails); 2 bad options, an unreadable grade, an "
        "unwritable report"
    )
    parser.add_argument("submission", help="your transformer.py (a file, a package, or its folder)")
    parser.add_argument(
        "--grade",
        metavar="FILE",
        help="a grade JSON of this very file (xfmr grade --json, xfmr check --json; matched by "
        "its sha256) instead of running the shared tests again",
    )
    parser.add_argument("--html", metavar="FILE", help="a side-by-side HTML page of the diff")
    parser.add_argument(
        "--as-written",
        action="store_true",
        help="diff the definitions as written (by default comments, docstrings and blank lines "
        "are left out, so only code differs)",
    )
    parser.add_argument(
        "--gradescope",
        metavar="RESULTS",
        help="(run_autograder) add the diff to this results.json if it has the full score",
    )


def run_diff(args: argparse.Namespace) -> int:
    submission = Path(args.submission)
    if not submission.exists():
        return usage_error("diff", f"{submission} does not exist")
    for report in (args.html, args.gradescope):
        if report and (problem := report_path_problem(report)):
            return usage_error("diff", f"cannot write {report}: {problem}")
    if args.gradescope and not args.grade:
        return usage_error("diff", "--gradescope needs --grade (the grade of the same file)")
    if args.grade:
        failing = failing_from_grade(Path(args.grade), submission)
        if isinstance(failing, str):
            return usage_error("diff", failing)
    else:
        print(f"running the shared tests on {printable(str(submission))} ...", file=sys.stderr)
        failing, _ = failing_from_check(submission)
    if failing:
        print(
            f"xfmr diff: not yet: the reference is shown once every shared test passes; "
            f"{len(failing)} of {len(SHARED_TESTS)} still fail: {', '.join(failing)} "
            f"(xfmr check {printable(str(submission))} says why)",
            file=sys.stderr,
        )
        return 1
    if not REFERENCE.is_file():  # the student kit (harness.jobs.kit) holds no reference text
        print(NOT_IN_KIT)
        return 0
    m = matching(submission)
    said = text(m, args.as_written)
    if args.gradescope:
        return _into_gradescope(Path(args.gradescope), said)
    print(said, end="")
    written = write_all("diff", [(args.html, lambda: page(m, str(submission), args.as_written))])
    return 0 if written else 2


NOT_IN_KIT = (
    "Every shared test passes. The reference is not in the student kit, so there is nothing "
    "to diff against here: your course shows it where it decides, in the autograder after a "
    "full pass (staff: xfmr autograder gradescope --reveal-reference-after-pass adds this diff "
    "to a full-score result). Ask your course staff where."
)


def _into_gradescope(results: Path, said: str) -> int:
    try:
        data: dict[str, Any] = json.loads(results.read_text())
    except (OSError, ValueError) as e:
        return usage_error("diff", f"--gradescope {results}: cannot be read ({e})")
    added = with_reference(data, said)
    if added is data:
        print("xfmr diff: results.json is not a full score: left as it was", file=sys.stderr)
        return 1
    written = write_all("diff", [(str(results), lambda: added)])
    return 0 if written else 2


if __name__ == "__main__":  # python -m harness.students.diff: as `xfmr diff`
    parser = argparse.ArgumentParser(prog="xfmr diff")
    configure_diff(parser)
    sys.exit(run_diff(parser.parse_args()))
