"""The documents hold no count the code does not: every score out of the grade's total, every
number of shared tests, taken from the laws themselves; and every relative link (and every
anchor into the README) leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.shared_tests.laws import SHARED_TESTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / n for n in ("README.md", "CONTRIBUTING.md", "ARCHITECTURE.md", "CONTRACT.md")]
    + list((ROOT / "docs").glob("*.md"))
    + [ROOT / "tests" / "README.md", ROOT / "results" / "README.md"]
)
TOTAL = round(sum(t.points for t in SHARED_TESTS))
COUNT = len(SHARED_TESTS)


def _lines(doc: Path):
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        yield f"{doc.relative_to(ROOT)}:{number}", line


def test_the_counts_are_the_laws():
    assert TOTAL == 122 and COUNT == 19  # what the examples below were written against


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_count_in_the_docs_is_the_codes(doc):
    wrong = []
    for where, line in _lines(doc):
        # a score out of three digits is a grade's, out of the total of the shared tests' points
        wrong += [
            f"{where}: {m.group(0)}"
            for m in re.finditer(r"\b\d+/(\d{3})\b", line)
            if int(m.group(1)) != TOTAL
        ]
        # "19 shared tests", "(15/19 tests passed)": the shared tests' number; a student's own
        # `--tests` selection says "(1/2 shared tests passed)", so a fraction before it is a subset
        for m in re.finditer(r"(?<![/\d])\b(\d+) (?:shared )?tests\b(?! passed)", line):
            if "shared tests" in m.group(0) and int(m.group(1)) != COUNT:
                wrong.append(f"{where}: {m.group(0)}")
        for m in re.finditer(r"\((\d+)/(\d+) tests passed\)", line):
            if int(m.group(2)) != COUNT:
                wrong.append(f"{where}: {m.group(0)}")
    assert wrong == [], f"counts that are not the laws' ({COUNT} tests, {TOTAL} points)"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and spaces dropped,
    spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code shows commands, not links
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in anchors:
                broken.append(target)
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert broken == []
