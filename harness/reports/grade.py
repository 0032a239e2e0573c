"""A grade's own reports: the readable text, the JSON report and JUnit XML (Gradescope's
results.json is harness.reports.gradescope's; a batch's tables are harness.reports.grades').

Every renderer reads a `Grade` record (harness.records) and nothing else: the job that computed
the grade has finished, and every worker is gone, before any of these runs.
"""

from __future__ import annotations

import hashlib
import os
import stat
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness.isolation.staging import (
    MAX_BYTES,
    MAX_ENTRIES,
    UnsafeInput,
    kind_problem,
    open_regular,
    size_problem,
)
from harness.isolation.worker import printable
from harness.options import SANDBOX
from harness.outcomes import Outcome
from harness.records import Grade, TestResult

# JUnit's element for an outcome that is not a pass (a crash and a hang are errors, not failures)
_CHUNK = 1 << 20  # what one read of a hashed file holds

# How the text marks a test that is not a pass: a failed verdict is the submission's failure
# (KILLED is the matrix's word, for a mutant)
_MARKS = {Outcome.KILLED: "FAIL"}
MESSAGE_LINES = 8  # of each failure's message in the text (the JSON report holds it whole)
_WRAP = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="      ")

_JUNIT = {
    Outcome.KILLED: "failure",
    Outcome.ERROR: "error",
    Outcome.TIMEOUT: "error",
    Outcome.NOT_APPLICABLE: "skipped",
}


def text(g: Grade) -> str:
    """The readable summary: one line per test, then why each failure failed."""
    lines = [f"Grading {printable(g.submission)}", ""]
    if g.isolation != SANDBOX:
        lines += [g.isolation, ""]
    if g.rejected:
        lines += [printable(g.rejected), ""]
    width = max(len(printable(t.name)) for t in g.tests)
    for t in g.tests:
        mark = "PASS" if t.passed else _MARKS.get(t.outcome, t.outcome.value.upper())
        name = printable(t.name)
        points = f"{t.score:g}/{t.max_score:g}"
        lines.append(f"  {mark:<8} {name:<{width}}  {points}  {t.seconds:6.2f} s")
    failures = [t for t in g.tests if not t.passed and not g.rejected]
    if failures and g.error and len({t.message for t in failures}) == 1:
        # the grader's own failure, the same for every test: said once
        lines += ["", "Why (every test):"]
        lines += _said(printable(failures[0].message).splitlines(), "  ")
    elif failures:
        lines += ["", "Why:", *_why(failures, g.tests)]
    passed = f"{sum(t.passed for t in g.tests)}/{len(g.tests)} tests passed"
    if g.error:  # nothing the grader could not judge is charged
        score = f"Score: none: a grader error, nothing was charged ({passed}) in {g.seconds:.1f} s"
    else:
        score = f"Score: {g.score:g}/{g.max_score:g} ({passed}) in {g.seconds:.1f} s"
    lines += ["", score]
    if g.start_seconds:
        each = ", ".join(f"{x:.1f}" for x in g.start_seconds)
        lines.append(f"Worker start-up (process, interpreter, torch, the submission): {each} s")
    return "\n".join(lines)


def _why(failures: list[TestResult], tests: list[TestResult]) -> list[str]:
    """Why each failure failed, one entry per distinct error: a test alone as its name and law,
    then its message; tests whose messages start with the same line (a submission that does
    not load, one definition not written yet) as one entry naming them, the error said once."""
    groups: dict[str, list[TestResult]] = {}
    for t in failures:
        groups.setdefault((printable(t.message).splitlines() or [""])[0], []).append(t)
    lines = []
    for first, alike in groups.items():
        if len(alike) == 1:
            t = alike[0]
            lines.append(f"  {printable(t.name)} ({t.law})")
            lines += _said(printable(t.message).splitlines(), "    ")
            continue
        said = f"{len(alike)} tests: {', '.join(printable(t.name) for t in alike)}"
        if len(alike) == len(tests):
            said = f"every test ({len(tests)})"
        elif len(alike) > len(tests) / 2:  # the few it leaves out are the shorter list
            others = [printable(t.name) for t in tests if t not in alike]
            said = f"{len(alike)} of {len(tests)} tests, all but {', '.join(others)}"
        lines += _WRAP.wrap(f"{said}:")
        error = first.removeprefix("failed: ")
        rest: list[
            str
        ] = []  # each test's further lines, once, those that say the error again aside
        for t in alike:
            for line in printable(t.message).splitlines()[1:]:
                if error not in line and not _points_within(line, alike) and line not in rest:
                    rest.append(line)
        lines += _said([first, *rest], "    ")
    return lines


def _points_within(line: str, alike: list[TestResult]) -> bool:
    """A line that points to another test of the same entry for what is said there."""
    return line.startswith("(") and any(f"under {t.name})" in line for t in alike)


def _said(message: list[str], indent: str) -> list[str]:
    """A message's first MESSAGE_LINES lines, and how many more the JSON report holds."""
    shown = [f"{indent}{line}" for line in message[:MESSAGE_LINES]]
    if len(message) > MESSAGE_LINES:
        more = len(message) - MESSAGE_LINES
        shown.append(
            f"{indent}({more} more line{'s' * (more > 1)} in the JSON report: --json FILE)"
        )
    return shown


def sha256_of(path: str | Path) -> str:
    """The submission's sha256 (hex): a file's bytes, or a folder's regular files (each relative
    path and its bytes, in sorted order, caches aside); "" if it cannot be read or is past the
    staging caps (hashed() says why)."""
    return hashed(path)[0]


def hashed(path: str | Path) -> tuple[str, str]:
    """(sha256_of's digest, what it left out and why: "" when nothing). Nothing is followed or
    opened but regular files and folders (lstat first, as staging does: a link, a named pipe, a
    socket or a device is skipped by name), each file read in chunks, and no more is read than
    staging would copy (its MAX_BYTES, MAX_ENTRIES; a file's apparent size is checked before a
    byte of it is read, so a huge sparse file costs nothing): a report's hash never costs the
    grader more than staging the submission would."""
    path = Path(path)
    digest = hashlib.sha256()
    skipped: list[str] = []
    left = [MAX_BYTES, MAX_ENTRIES]  # bytes, entries

    def file_digest(file: Path, where: str, info: os.stat_result) -> bytes:
        if problem := size_problem(info.st_size, where, left[0]):
            raise UnsafeInput(problem)
        one = hashlib.sha256()
        fd = open_regular(file, where, info)
        try:
            while chunk := os.read(fd, min(_CHUNK, left[0] + 1)):
                left[0] -= len(chunk)
                if left[0] < 0:  # it grew past the cap while being read
                    raise UnsafeInput(size_problem(MAX_BYTES - left[0], where, 0))
                one.update(chunk)
        finally:
            os.close(fd)
        return one.digest()

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as found:
            names = []
            for entry in found:
                left[1] -= 1  # counted as listed: no huge list held
                if left[1] < 0:
                    raise UnsafeInput(f"the submission holds more than {MAX_ENTRIES} entries")
                if entry.name != "__pycache__":
                    names.append(entry.name)
        for name in sorted(names):
            where = f"{prefix}{name}"
            info = os.lstat(folder / name)
            if stat.S_ISDIR(info.st_mode):
                walk(folder / name, f"{where}/")
            elif problem := kind_problem(info.st_mode, where):
                skipped.append(problem)
            else:
                encoded = where.encode()
                digest.update(len(encoded).to_bytes(8, "big") + encoded)
                digest.update(file_digest(folder / name, where, info))

    try:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            walk(path, "")
        elif problem := kind_problem(info.st_mode, path.name):
            return "", f"not hashed: {problem}"
        else:
            return file_digest(path, path.name, info).hex(), ""
    except UnsafeInput as e:
        return "", f"not hashed: {e}"
    except OSError as e:
        return "", f"not hashed: {path} cannot be read ({e.strerror or e})"
    return digest.hexdigest(), ("skipped: " + "; ".join(skipped)) if skipped else ""


def to_json(g: Grade) -> dict[str, Any]:
    """The JSON report (`xfmr grade --json`): the totals first, then every test."""
    digest, note = hashed(g.submission)
    return {
        "submission": g.submission,
        "sha256": digest,  # what `xfmr diff --grade` matches the file by
        "sha256_note": note,  # what the hash left out (links, special files, past the caps)
        "score": g.score,
        "max_score": g.max_score,
        "passed": g.passed,
        "rejected": g.rejected,
        "diagnosis": g.diagnosis,
        "seconds": round(g.seconds, 2),
        "isolation": g.isolation,
        "start_seconds": [round(x, 3) for x in g.start_seconds],
        "grader_error": g.error,
        "tests": [t.to_json() for t in g.tests],
    }


def junit(g: Grade) -> str:
    """JUnit XML: one testcase per shared test; crashes and timeouts as <error>."""
    count = {kind: 0 for kind in ("failure", "error", "skipped")}
    for t in g.tests:
        if t.outcome in _JUNIT:
            count[_JUNIT[t.outcome]] += 1
    suite = ET.Element(
        "testsuite",
        name=printable(f"xfmr grade {Path(g.submission).name}"),
        tests=str(len(g.tests)),
        failures=str(count["failure"]),
        errors=str(count["error"]),
        skipped=str(count["skipped"]),
        time=f"{g.seconds:.3f}",
    )
    for t in g.tests:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="xfmr.shared_tests",
            name=printable(t.name),
            time=f"{t.seconds:.3f}",
        )
        kind = _JUNIT.get(t.outcome)
        if kind == "skipped":
            ET.SubElement(case, kind)
        elif kind is not None:
            message = printable(t.message)  # XML 1.0 forbids most control characters
            first = (message.splitlines() or [""])[0]
            ET.SubElement(case, kind, message=first).text = message
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
