"""A grade's own reports: the readable text, the JSON report and JUnit XML (Gradescope's
results.json is harness.reports.gradescope's; a batch's tables are harness.reports.grades').

Every renderer reads a `Grade` record (harness.records) and nothing else: the job that computed
the grade has finished, and every worker is gone, before any of these runs.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness.isolation.worker import printable
from harness.options import SANDBOX
from harness.outcomes import Outcome
from harness.records import Grade

# JUnit's element for an outcome that is not a pass (a crash and a hang are errors, not failures)
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
        lines += [g.rejected, ""]
    width = max(len(t.name) for t in g.tests)
    for t in g.tests:
        mark = "PASS" if t.passed else t.outcome.value.upper()
        lines.append(
            f"  {mark:<8} {t.name:<{width}}  {t.score:g}/{t.max_score:g}  {t.seconds:6.2f} s"
        )
    failures = [t for t in g.tests if not t.passed and not g.rejected]
    if failures:
        lines += ["", "Why:"]
        for t in failures:
            lines.append(f"  {t.name} ({t.law})")
            lines += [f"    {line}" for line in t.message.splitlines()[:8]]
    lines += [
        "",
        f"Score: {g.score:g}/{g.max_score:g} ({sum(t.passed for t in g.tests)}/{len(g.tests)} "
        f"tests passed) in {g.seconds:.1f} s",
    ]
    if g.start_seconds:
        each = ", ".join(f"{x:.1f}" for x in g.start_seconds)
        lines.append(f"Worker start-up (process, interpreter, torch, the submission): {each} s")
    return "\n".join(lines)


def sha256_of(path: str | Path) -> str:
    """The submission's sha256 (hex): a file's bytes, or a folder's files (each relative path
    and its bytes, in sorted order, caches aside); "" if it cannot be read."""
    path = Path(path)
    digest = hashlib.sha256()
    try:
        if not path.is_dir():
            return hashlib.sha256(path.read_bytes()).hexdigest()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            if "__pycache__" not in file.parts:
                name = file.relative_to(path).as_posix().encode()
                digest.update(len(name).to_bytes(8, "big") + name)
                digest.update(hashlib.sha256(file.read_bytes()).digest())
    except OSError:
        return ""
    return digest.hexdigest()


def to_json(g: Grade) -> dict[str, Any]:
    """The JSON report (`xfmr grade --json`): the totals first, then every test."""
    return {
        "submission": g.submission,
        "sha256": sha256_of(g.submission),  # what `xfmr diff --grade` matches the file by
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
            suite, "testcase", classname="xfmr.shared_tests", name=t.name, time=f"{t.seconds:.3f}"
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
