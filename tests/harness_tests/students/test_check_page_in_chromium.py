"""`xfmr check --html FILE`, read back in a real browser: the real command on a mask fault
(examples/faulty_submission.py: cross-attention reads source padding) and a value fault (scores
not divided by sqrt(d_k), planted in the correct example as mutants/student_faults.py plants
it), each page opened in headless Chromium (its DOM and a screenshot), and the self-check's
page-only path (check_page.wanted, page_pictures) with stand-in workers."""

from __future__ import annotations

import json
import re
import subprocess
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from harness import grading
from harness.cli import main
from harness.isolation.worker import WorkerDied
from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import check_page
from harness.shared_tests.pictures import MASKING, REAL, SOURCE, TARGET
from harness.students import selfcheck
from harness.tools.render_stryker import CHROMIUM_FLAGS
from mutants.student_faults import FAULTS

ROOT = Path(__file__).resolve().parents[3]
T, S = TARGET, SOURCE


def a_grade(failed: tuple[str, ...], diagnosis: dict[str, str] | None = None, **kw) -> Grade:
    names = ("test_golden_torch", "test_decoder_is_causal", "test_source_padding_is_never_read")
    tests = [
        TestResult(n, "", Outcome.KILLED if n in failed else Outcome.PASSED, 0, 5, "", 0.1)
        for n in names
    ]
    return Grade("transformer.py", tests, diagnosis=diagnosis or {}, **kw)


def test_the_pictures_wanted_follow_what_failed():
    assert MASKING >= {
        "test_decoder_is_causal",
        "test_source_padding_is_never_read",
        "test_decoder_reads_the_source",
    }
    assert "test_golden_torch" not in MASKING
    assert check_page.wanted(a_grade(())) == (False, False)
    assert check_page.wanted(a_grade(("test_decoder_is_causal",))) == (True, False)
    assert check_page.wanted(a_grade(("test_golden_torch",), {"c": "first"})) == (False, True)
    rejected = a_grade(("test_decoder_is_causal",), {"c": "x"}, rejected="rejected: too big")
    assert check_page.wanted(rejected) == (False, False)


def test_a_worker_that_dies_leaves_a_note_not_an_exception(tmp_path, monkeypatch):
    class Dying:
        def call(self, probe, deadline, **inputs):
            raise WorkerDied("exit status -9")

        def close(self):
            self.closed = True

    dying = Dying()

    @contextmanager
    def workers(path, folder):
        assert path == sub and folder is None
        yield grading.Placement(lambda subject: SimpleNamespace(worker=lambda: dying))

    monkeypatch.setattr(selfcheck, "local_workers", workers)
    sub = tmp_path / "transformer.py"
    sub.write_text("")
    g = a_grade(("test_decoder_is_causal", "test_golden_torch"), {"c": "first divergence: x"})
    found = selfcheck.page_pictures(str(sub), g)
    assert not found.grids and not found.bars and dying.closed
    assert any("WorkerDied: exit status -9" in n for n in found.notes), found.notes
    # and a passing self-check starts no worker at all
    monkeypatch.setattr(selfcheck, "local_workers", None)
    assert selfcheck.page_pictures(str(sub), a_grade(())) == check_page.Pictures()


def test_html_without_a_submission_or_with_an_unwritable_path_is_a_usage_error(tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["check", "--suite", str(tmp_path), "--html", str(page)]) == 2
    assert "--html is the shared tests' page" in capsys.readouterr().err
    sub = tmp_path / "transformer.py"
    sub.write_text("")
    assert main(["check", str(sub), "--html", str(tmp_path / "no" / "page.html")]) == 2
    assert "cannot write a report" in capsys.readouterr().err
    assert not page.exists()


# --- the real command, read back in Chromium ---------------------------------------------------


def browse(browser: Path, page: Path, profile: Path, *what: str) -> str:
    done = subprocess.run(
        [str(browser), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *what, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def checked(tmp_path: Path, name: str, source: str, capsys) -> tuple[Path, dict]:
    """`xfmr check SUB --html PAGE --json J` on `source`: the page and the grade's JSON."""
    sub = tmp_path / name / "transformer.py"
    sub.parent.mkdir()
    sub.write_text(source)
    page, report = tmp_path / f"{name}.html", tmp_path / f"{name}.json"
    assert main(["check", str(sub), "--html", str(page), "--json", str(report)]) == 1
    capsys.readouterr()
    return page, json.loads(report.read_text())


class Tags(HTMLParser):
    """Every start tag with its attributes, as the browser left the DOM."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def classed(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


def grid_cells(dom: str, key: str) -> dict[tuple[int, int], str]:
    """The model panel of grid `key` in the DOM: (row, col) -> the cell's kind."""
    part = dom[dom.index(f'id="grid-{key}-model"') :]
    part = part[: part.index("</svg>")]
    return {
        (int(a["data-row"]), int(a["data-col"])): a["class"].split()[1]
        for a in Tags(part).classed("g", "cell")
    }


def read_back(chromium: Path, page: Path, tmp_path: Path) -> tuple[str, Any]:
    """The page's DOM as Chromium builds it, and a screenshot of it (an RGB array)."""
    image = pytest.importorskip("PIL.Image")  # matplotlib's (the plots extra CI installs)
    text = page.read_text()
    # nothing outside the page: no script, no URL, no external reference of any kind
    for needle in ("<script", "http:", "https:", "src=", "href=", "url(", "@import", "<link"):
        assert needle not in text.lower(), needle
    dom = browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert "</html>" in dom and "<script" not in dom
    shot = tmp_path / f"{page.stem}.png"
    browse(chromium, page, tmp_path / "profile", "--window-size=1200,2400", f"--screenshot={shot}")
    pixels = np.asarray(image.open(shot).convert("RGB"))
    return dom, pixels


def first_named(diagnosis: dict[str, str]) -> str:
    """The module the diagnosis's first config names as its first divergence."""
    said = next(iter(diagnosis.values()))
    found = re.match(r"first divergence: ([\w.]+)", said)
    assert found, said
    return found.group(1)


def red_pixels(pixels: np.ndarray) -> int:
    """Pixels of the page's red (forbidden reads, departing modules): #d62728."""
    return int(np.all(np.abs(pixels.astype(int) - (0xD6, 0x27, 0x28)) <= 8, axis=-1).sum())


def not_blank(pixels: np.ndarray) -> None:
    colours = {tuple(c) for c in pixels.reshape(-1, 3)[::97]}
    assert pixels.shape[0] >= 2000 and len(colours) > 20, len(colours)
    assert (pixels < 200).any(axis=-1).mean() > 0.02  # text and pictures, not a white page


@pytest.mark.slow
def test_a_mask_fault_page_shows_the_padded_columns_read(chromium, tmp_path, capsys):
    source = (ROOT / "examples" / "faulty_submission.py").read_text()
    page, report = checked(tmp_path, "faulty", source, capsys)
    dom, pixels = read_back(chromium, page, tmp_path)
    failed = {t["name"] for t in report["tests"] if t["outcome"] != "passed"}
    assert "test_source_padding_is_never_read" in failed
    # the source grid: every output position reads the three padded source positions, and
    # nothing else it must not; the decoder's causal grid is clean
    source_cells = grid_cells(dom, "source")
    assert {k for k, v in source_cells.items() if v == "read-forbidden"} == {
        (i, j) for i in range(T) for j in range(REAL, S)
    }
    assert {k for k, v in source_cells.items() if v == "read"} == {
        (i, j) for i in range(T) for j in range(REAL)
    }
    assert "read-forbidden" not in grid_cells(dom, "targets").values()
    # the bars: the first divergence marked where the diagnosis names it
    tags = Tags(dom)
    first = tags.classed("g", "first")
    assert len(first) == len(report["diagnosis"])
    assert first[0]["data-module"] == first_named(report["diagnosis"]) == "decoder.0.cross_attn"
    not_blank(pixels)
    assert red_pixels(pixels) > 500
    print(f"page {page.stat().st_size} bytes")


@pytest.mark.slow
def test_a_value_fault_page_shows_the_stack_and_its_first_divergence(chromium, tmp_path, capsys):
    fault = next(f for f in FAULTS if f.id == "no-scale")
    page, report = checked(tmp_path, "no_scale", fault.source("example"), capsys)
    dom, pixels = read_back(chromium, page, tmp_path)
    tags = Tags(dom)
    assert not tags.classed("svg", "grid")  # no masking test failed: no grid
    figures = tags.classed("figure", "divergence")
    assert [f["data-config"] for f in figures] == list(report["diagnosis"])
    bars = tags.classed("g", "bar")
    modules = [b["data-module"] for b in bars]
    assert modules[0] == "x0 (source embeddings)" and "logits" in modules
    first = tags.classed("g", "first")
    assert first[0]["data-module"] == first_named(report["diagnosis"]) == fault.place
    # before the first divergence every module matches, within the tolerance
    before = modules.index(fault.place)
    assert all("match" in b["class"].split() for b in bars[:before])
    assert all(float(b["data-error"]) < 1e-10 for b in bars[:before])
    assert float(first[0]["data-error"]) > 0.1
    not_blank(pixels)
    assert red_pixels(pixels) > 500
