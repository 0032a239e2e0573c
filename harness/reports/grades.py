"""A batch of grades as tables, and `xfmr summarize`: the same tables from collected Gradescope
results.json files.

`grade-batch` and `summarize` print and write the same two tables, computed here from plain
records (`Graded`): one row per submission (score, max, passed, each test's outcome) and the
tests students fail most (failures, of how many, share, usual outcome). grade-batch builds the
records from its grades; summarize reads them from a folder of Gradescope results.json files
(the format `xfmr grade --gradescope` writes, Gradescope's autograder specification: `score`,
`output`, `tests[]` with `name`, `score`, `max_score`, `status`, `output`), which is where a
course that grades on Gradescope has them. A file that is not such a results file (not JSON, cut
short, fields of the wrong type) is named, skipped and counted; it never stops the summary.

Both also write report.html (harness.reports.class_report) from the same records, which carry
what the tables leave out: the first divergences the diagnosis names (`first_causes`, from a
grade's diagnosis or read back from its tests' output), the grading time where recorded, and
the submission's own report file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.isolation.worker import printable
from harness.options import usage_error
from harness.outcomes import Outcome
from harness.records import Grade
from harness.reports.class_report import html_report
from harness.reports.safe import markdown_table, to_csv
from harness.reports.writer import report_path_problem, write_all

if TYPE_CHECKING:  # pandas is imported where a table is made: a check or a grade needs none
    import pandas as pd

HARDEST_COLUMNS = ["test", "failed", "of", "share", "usual outcome"]
# The files summarize reads unless told otherwise: Gradescope's name, and grade-batch's.
PATTERNS = ("results.json", "*.gradescope.json")
# A results file larger than this is not one of ours (19 tests and their messages: ~20 kB).
MAX_BYTES = 16 << 20

# How a failed test's Gradescope output begins (harness.jobs.grade's reasons), read back as the
# outcome it was; any other failed test is "failed".
_OUTCOME_OF_REASON = {
    "failed:": Outcome.KILLED.value,
    "crashed:": Outcome.ERROR.value,
    "timed out:": Outcome.TIMEOUT.value,
    "not applicable": Outcome.NOT_APPLICABLE.value,
}


@dataclass(frozen=True)
class TestLine:
    """One test of one submission: whether it passed and its outcome (an Outcome value, or
    "failed" for a failure whose kind a results file does not say)."""

    name: str
    passed: bool
    outcome: str
    message: str = ""  # why it failed, as the grade says it (printable)
    score: float | None = None  # its points, where the record says them
    max_score: float | None = None

    @property
    def judged(self) -> bool:
        """False for a failure that is no verdict: a prerequisite failed, and the message says
        the test was not judged (harness.shared_tests: "not judged: X must pass first")."""
        return self.passed or not _NOT_JUDGED.match(self.message)


# A test's message when it was not judged, after grade's reason for the outcome.
_NOT_JUDGED = re.compile(r"(?:(?:failed|crashed|timed out|not applicable): )?not judged\b")
# What became of an entry of a class folder (or a results file read): only GRADED ones count.
GRADED, REJECTED, GRADER_ERROR, NOT_A_SUBMISSION = (
    "graded",
    "rejected",
    "grader error",
    "not a submission",
)
STATUSES = (GRADED, REJECTED, GRADER_ERROR, NOT_A_SUBMISSION)
COLUMNS = ["submission", "status", "score", "max_score", "passed", "reason"]


@dataclass
class Graded:
    """One entry's grade as the tables need it: a submission's, or an entry of a class folder
    that is not a submission (`not_a_submission`: why; no score, no test)."""

    submission: str
    score: float
    max_score: float
    passed: bool
    tests: list[TestLine] = field(default_factory=list)
    rejected: str = ""  # why nothing of it ran, if nothing did
    error: str = ""  # the grader's own failure on it, if any
    causes: tuple[tuple[str, str], ...] = ()  # first divergences named: (where, cause or "")
    seconds: float | None = None  # how long grading it took, where recorded
    report: str = ""  # the path of its own report file, where one was written
    not_a_submission: str = ""  # why an entry of a class folder was not graded at all
    diagnosis: tuple[tuple[str, str], ...] = ()  # (config, the forward pass's diagnosis)
    page: str = ""  # the path of its own HTML page, where one was written

    @classmethod
    def of(cls, g: Grade, report: str = "", page: str = "") -> Graded:
        """A grade as the tables read it (grade-batch's; summarize reads results files)."""
        lines = [
            TestLine(
                printable(t.name),
                t.passed,
                t.outcome.value,
                printable(t.message),
                t.score,
                t.max_score,
            )
            for t in g.tests
        ]
        name = Path(g.submission).name
        causes = first_causes(g.diagnosis.values())
        return cls(
            name,
            g.score,
            g.max_score,
            g.passed,
            lines,
            g.rejected,
            g.error,
            causes,
            g.seconds,
            report,
            diagnosis=tuple((printable(k), printable(v)) for k, v in g.diagnosis.items()),
            page=page,
        )

    @classmethod
    def not_graded(cls, name: str, why: str) -> Graded:
        """An entry of a class folder that is not a submission, with why."""
        return cls(name, 0.0, 0.0, False, not_a_submission=why)

    @property
    def status(self) -> str:
        """One of STATUSES."""
        if self.not_a_submission:
            return NOT_A_SUBMISSION
        return REJECTED if self.rejected else GRADER_ERROR if self.error else GRADED

    @property
    def reason(self) -> str:
        """Why it was not graded ("" if it was): the rejection, the grader error's last line,
        or why the entry is not a submission; printable."""
        if self.not_a_submission or self.rejected:
            return printable(self.not_a_submission or self.rejected)
        last = [line for line in self.error.splitlines() if line.strip()][-1:]
        return printable(f"grader error: {last[0].strip()}") if last else ""

    @property
    def counted(self) -> bool:
        """Does it count among the submissions that ran? A rejected submission and a grader
        error failed no test, and an entry that is not a submission is none."""
        return self.status == GRADED


# How the diagnosis names a first divergence (harness.shared_tests.diagnosis.divergence):
# "first divergence: WHERE[, max abs error N (relative)][: CAUSE][; largest: ...]; the logits
# differ by ...", one line per config, in a grade's diagnosis and in its value test's output.
_DIVERGENCE = "first divergence: "
_AFTER = ("; largest: ", "; the logits differ by ")
_SIZE = re.compile(r", max abs error [^:;]*?\(relative\)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
MAX_CAUSES = 20  # per submission: a results file is untrusted text
MAX_CAUSE_CHARS = 300
MAX_MESSAGE_CHARS = 20_000  # a test's message read from a results file (ours: ~2 kB at most)


def first_causes(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Each first divergence the diagnosis names in `texts` (its lines, or test outputs that hold
    them) as (where, cause), cause "" where none is named; causes that differ only in their
    numbers (another config's error sizes, its eps) are one, the first said kept."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for text in texts:
        for line in text.splitlines() if isinstance(text, str) else ():
            start = line.find(_DIVERGENCE)
            if start < 0:
                continue
            said = line[start + len(_DIVERGENCE) :]
            for end in _AFTER:
                said = said.split(end, 1)[0]
            size = _SIZE.search(said)
            if size and ": " not in said[: size.start()]:
                where, cause = said[: size.start()], said[size.end() :].removeprefix(": ")
            else:
                where, _, cause = said.partition(": ")
            where = printable(where.strip())[:MAX_CAUSE_CHARS]
            cause = printable(cause.strip())[:MAX_CAUSE_CHARS]
            if where:
                found.setdefault((where, _NUMBER.sub("#", cause)), (where, cause))
            if len(found) >= MAX_CAUSES:
                return tuple(found.values())
    return tuple(found.values())


def batch_table(grades: Sequence[Graded]) -> pd.DataFrame:
    """One row per entry: its status (STATUSES) and reason, score, max, passed, each test's
    outcome; an entry that is not a submission has no score (an empty cell)."""
    import pandas as pd

    rows = []
    for g in grades:
        graded = g.status != NOT_A_SUBMISSION
        row: dict[str, Any] = {
            "submission": printable(g.submission),
            "status": g.status,
            "score": g.score if graded else math.nan,
            "max_score": g.max_score if graded else math.nan,
            "passed": g.passed,
            "reason": g.reason,
        }
        row.update({t.name: t.outcome for t in g.tests})
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else COLUMNS)


def counts(grades: Sequence[Graded]) -> dict[str, int]:
    """How many entries of each status (STATUSES, every one present)."""
    return {status: sum(g.status == status for g in grades) for status in STATUSES}


def counts_line(grades: Sequence[Graded]) -> str:
    """The counts in words: "7 entries: 4 graded, 1 rejected, 0 grader errors, 2 not
    submissions" (they add up to the entries)."""
    n = counts(grades)
    words = {GRADER_ERROR: "grader errors", NOT_A_SUBMISSION: "not submissions"}
    said = ", ".join(f"{n[s]} {s if n[s] == 1 else words.get(s, s)}" for s in STATUSES)
    return f"{len(grades)} {'entry' if len(grades) == 1 else 'entries'}: {said}"


def hardest(grades: Sequence[Graded]) -> pd.DataFrame:
    """Which tests students fail most: failures, of how many, share, most common outcome. Only
    the submissions that ran count (rejected ones and grader errors failed no test)."""
    import pandas as pd

    cells = pd.DataFrame(
        [
            {"test": t.name, "failed": not t.passed, "outcome": t.outcome}
            for g in grades
            if g.counted
            for t in g.tests
        ],
        columns=["test", "failed", "outcome"],
    )
    if cells.empty:  # no submission ran: no test is hardest
        return pd.DataFrame(columns=HARDEST_COLUMNS)
    failing = cells[cells.failed]
    table = cells.groupby("test", sort=False).agg(failed=("failed", "sum"), of=("failed", "size"))
    table["share"] = (table.failed / table["of"]).round(2)
    table["usual outcome"] = failing.groupby("test")["outcome"].agg(
        lambda s: s.value_counts().index[0]
    )
    table["usual outcome"] = table["usual outcome"].fillna("")
    return table.sort_values("failed", ascending=False, kind="stable").reset_index()


def summary_text(grades: Sequence[Graded]) -> str:
    """What grade-batch and summarize print: the table, the hardest tests, what was not counted."""
    table, worst = batch_table(grades), hardest(grades)
    shown = table[["submission", "status", "score", "max_score", "passed"]]
    lines = [shown.to_string(index=False, na_rep="-")]
    lines += ["", "Tests students fail most (of the submissions that ran):"]
    lines += [worst.to_string(index=False) if not worst.empty else "  none: no submission ran"]
    for g in grades:
        if not g.counted:
            why = g.reason or g.status
            if g.status == NOT_A_SUBMISSION:
                why = f"{NOT_A_SUBMISSION}: {why}"
            lines.append(f"not counted: {printable(Path(g.submission).name)}: {why}")
    lines += ["", counts_line(grades)]
    return "\n".join(lines)


def markdown(grades: Sequence[Graded]) -> str:
    """Both tables in Markdown, every cell escaped (student file names and messages are text)."""
    table, worst = batch_table(grades), hardest(grades)
    return (
        "## Grades\n\n"
        + markdown_table(table[COLUMNS])
        + "\n## Tests students fail most (of the submissions that ran)\n\n"
        + markdown_table(worst)
    )


# --- reading Gradescope's results.json -------------------------------------------------------


class NotResults(ValueError):
    """A file that is not a Gradescope results file, with the reason."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise NotResults(f"{where} is {value!r}, not a number")
    return float(value)


def _test_line(entry: Any, i: int) -> tuple[TestLine, float | None, float] | None:
    """One entry of `tests`: its line, score (None if absent) and max_score (0 if absent); None
    for an entry that says neither a status nor a score (information only, not a test)."""
    where = f"tests[{i}]"
    if not isinstance(entry, dict):
        raise NotResults(f"{where} is not an object")
    name = entry.get("name", entry.get("number", f"#{i + 1}"))
    if not isinstance(name, str | int | float) or isinstance(name, bool):
        raise NotResults(f"{where}.name is {name!r}, not a text")
    score = _number(entry["score"], f"{where}.score") if "score" in entry else None
    most = _number(entry["max_score"], f"{where}.max_score") if "max_score" in entry else None
    status = entry.get("status")
    if status is not None and status not in ("passed", "failed"):
        raise NotResults(f"{where}.status is {status!r}, not 'passed' or 'failed'")
    if status is not None:
        passed = status == "passed"
    elif score is None or most is None:
        return None
    else:
        passed = bool(score >= most)
    output = entry.get("output", "")
    outcome = Outcome.PASSED.value
    text = output[:MAX_MESSAGE_CHARS] if isinstance(output, str) else ""
    if not passed:
        starts = [o for reason, o in _OUTCOME_OF_REASON.items() if text.startswith(reason)]
        outcome = starts[0] if starts else "failed"
    line = TestLine(printable(str(name)), passed, outcome, printable(text), score, most)
    return line, score, most or 0.0


def read_results(path: Path, submission: str) -> Graded:
    """A Gradescope results file as a Graded; NotResults (with the reason) if it is not one."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise NotResults(f"larger than {MAX_BYTES >> 20} MiB")
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise NotResults(f"could not be read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NotResults(f"not JSON (cut short or not a results file): {e}") from None
    except RecursionError:
        raise NotResults("not JSON: nested too deep") from None
    if not isinstance(data, dict):
        raise NotResults(f"a JSON {type(data).__name__}, not an object")
    if "tests" not in data and "score" not in data:
        raise NotResults("neither `tests` nor `score`: not a Gradescope results file")
    entries = data.get("tests", [])
    if not isinstance(entries, list):
        raise NotResults("`tests` is not a list")
    read = [_test_line(entry, i) for i, entry in enumerate(entries)]
    lines = [r for r in read if r is not None]
    output = data.get("output", "")
    output = output if isinstance(output, str) else ""
    scores = [s for _, s, _ in lines if s is not None]
    if "score" in data:
        score = _number(data["score"], "score")
    else:
        score = sum(scores)
    tests = [line for line, _, _ in lines]
    error = ""
    if output.startswith("GRADER ERROR") or ("score" not in data and not scores):
        error = printable(output.splitlines()[0] if output else "no score: a grader error")
    rejected = ""
    outputs = {e.get("output") for e in entries if isinstance(e, dict)}
    if (
        not error
        and tests
        and not any(t.passed for t in tests)
        and len(outputs) == 1
        and isinstance(first := next(iter(outputs)), str)
        and first
        and output.startswith(first)
    ):  # every test says what the whole says: nothing of it ran (harness.jobs.grade.grade)
        rejected = printable(first)
        tests = [  # as grade-batch's
            TestLine(t.name, False, Outcome.ERROR.value, t.message, t.score, t.max_score)
            for t in tests
        ]
    passed = bool(tests) and all(t.passed for t in tests) and not error
    most = sum(m for _, _, m in lines)
    causes = first_causes(e.get("output", "") for e in entries if isinstance(e, dict))
    took = data.get("execution_time")  # optional in Gradescope's format: never a reason to skip
    seconds = None
    if isinstance(took, int | float) and not isinstance(took, bool) and 0 <= took < math.inf:
        seconds = float(took)
    return Graded(
        submission, score, most, passed, tests, rejected, error, causes, seconds, str(path)
    )


def results_files(folder: Path, patterns: Sequence[str] = PATTERNS) -> Iterator[Path]:
    """Every file under `folder` (recursively, links not followed) matching a pattern, by path."""
    found = {p for pattern in patterns for p in folder.rglob(pattern) if p.is_file()}
    yield from sorted(p for p in found if not p.is_symlink())


def submission_name(path: Path, folder: Path) -> str:
    """A results file's submission: the folder holding a results.json (Gradescope's export
    holds one per submission), else the file's name without `.gradescope.json` / `.json`."""
    relative = path.relative_to(folder)
    if path.name == "results.json":
        parent = relative.parent
        if parent.name == "results" and parent.parent != Path("."):  # .../results/results.json
            parent = parent.parent
        return str(parent) if parent != Path(".") else folder.name
    for suffix in (".gradescope.json", ".json"):
        if relative.name.endswith(suffix) and relative.name != suffix:
            return str(relative)[: -len(suffix)]
    return str(relative)


def summarize_folder(
    folder: Path, patterns: Sequence[str] = PATTERNS
) -> tuple[list[Graded], list[tuple[Path, str]]]:
    """Every results file under `folder` read: the grades, and each skipped file with why."""
    grades, skipped = [], []
    for path in results_files(folder, patterns):
        try:
            grades.append(read_results(path, submission_name(path, folder)))
        except NotResults as e:
            skipped.append((path, str(e)))
    return grades, skipped


# --- xfmr summarize ------------------------------------------------------------------------------


def configure_summarize(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 every file read; 1 some files skipped (each named); 2 nothing to "
        "summarize (no such folder, no results file, none readable) or a report not written"
    )
    parser.add_argument("folder", help="a folder of collected results.json files (recursively)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="also write grades.csv, hardest_tests.csv and report.html (a class report) there",
    )
    parser.add_argument("--markdown", metavar="FILE", help="both tables as Markdown")
    parser.add_argument(
        "--glob",
        action="append",
        metavar="PATTERN",
        help=f"which files to read (repeatable; default {' and '.join(PATTERNS)})",
    )


def run_summarize(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        return usage_error("summarize", f"{folder} is not a folder")
    out = Path(args.out) if args.out else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return usage_error("summarize", f"cannot create {out}: {e.strerror or e}")
    paths = [out / "grades.csv", out / "hardest_tests.csv", out / "report.html"] if out else []
    for path in [*paths, *([args.markdown] if args.markdown else [])]:
        if problem := report_path_problem(path):
            return usage_error("summarize", f"cannot write a report: {problem}")
    patterns = tuple(args.glob or PATTERNS)
    grades, skipped = summarize_folder(folder, patterns)
    if grades:
        print(summary_text(grades))
    for path, why in skipped:
        print(f"skipped {printable(str(path))}: {printable(why)}")
    if not grades:
        return usage_error(
            "summarize", f"no results file to summarize in {folder} ({len(skipped)} skipped)"
        )
    print(f"\nread {len(grades)} results files, skipped {len(skipped)}")
    written = write_all(
        "summarize",
        [
            (paths[0] if out else None, lambda: to_csv(batch_table(grades))),
            (paths[1] if out else None, lambda: to_csv(hardest(grades))),
            (paths[2] if out else None, lambda: html_report(grades, out or Path("."))),
            (args.markdown, lambda: markdown(grades)),
        ],
    )
    if out:
        print(f"wrote {out}/grades.csv, {out}/hardest_tests.csv and {out}/report.html")
    if not written:
        return 2
    return 1 if skipped else 0
