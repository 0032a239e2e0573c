"""results/'s map (harness.tools.results_map): every figure listed with its command, commit and
code; README rendered from the manifest; and a figure whose code changed after it was measured
flagged unless a note says why it stands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.tools import results_map as rm


def test_the_projects_results_map_holds():
    """CI's guard: every figure under results/ is in the map, and none is stale without a note."""
    assert rm.problems() == []


def test_every_figure_has_a_command_and_names_real_code():
    entries = rm.load()
    names = rm.tracked()
    for e in entries.values():
        assert e.command.strip() and e.shows.strip(), e.path
        assert e.depends and rm.files_of(e.depends, names), e.path


def test_docstrings_comments_and_annotations_change_no_figure():
    a = b'"""doc"""\nx: int = 1  # note\ndef f(a: int) -> int:\n    """f."""\n    return a\n'
    b = b"x: float = 1\n\ndef f(a: str) -> str:\n    return a\n"
    c = b"x: int = 2\ndef f(a: int) -> int:\n    return a\n"
    assert rm.normalized("m.py", a) == rm.normalized("m.py", b)
    assert rm.normalized("m.py", a) != rm.normalized("m.py", c)
    # a dataclass field without a default is a field: removing one is a change
    assert rm.normalized("m.py", b"class C:\n    x: int\n") != rm.normalized(
        "m.py", b"class C:\n    pass\n"
    )


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def project(tmp_path):
    """A tiny checkout: one code file, one figure measured on it, the map rendered."""
    root = tmp_path / "p"
    (root / "results").mkdir(parents=True)
    (root / "code.py").write_text("def rate():\n    return 2\n")
    (root / "results" / "figure.md").write_text("rate: 2\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    _git(root, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    code = rm.digest(["code.py"], rm.tracked(root), rm.working_tree(root))
    entry = rm.Entry(
        "figure.md",
        "the rate",
        "python code.py",
        ("code.py",),
        _git(root, "rev-parse", "--short", "HEAD"),
        code,
    )
    rm.save({"figure.md": entry}, root / "results" / "manifest.json")
    (root / "results" / "README.md").write_text(rm.render({"figure.md": entry}))
    _git(root, "add", ".")
    return root


def test_a_changed_dependency_flags_the_figure_until_a_note_or_a_refresh(project):
    assert rm.problems(project) == []
    (project / "code.py").write_text('def rate():\n    """Now documented."""\n    return 2\n')
    assert rm.problems(project) == []  # a docstring is not the code a figure measures
    (project / "code.py").write_text("def rate():\n    return 3\n")
    found = rm.problems(project)
    assert len(found) == 1 and "results/figure.md is stale" in found[0] and "code.py" in found[0]
    manifest = project / "results" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["figure.md"]["stale"] = "waits for a rerun at the new rate"
    manifest.write_text(json.dumps(data))
    entries = rm.load(manifest)
    (project / "results" / "README.md").write_text(rm.render(entries))
    assert rm.problems(project) == []  # marked: the README says so
    assert "**stale**: waits for a rerun" in (project / "results" / "README.md").read_text()
    rm.refresh(["results/figure.md"], project)
    assert rm.load(manifest)["figure.md"].stale == ""


def test_an_unlisted_figure_a_lost_one_and_a_renamed_dependency_are_named(project):
    (project / "results" / "new.md").write_text("x\n")
    (project / "results" / "figure.md").unlink()
    _git(project, "mv", "code.py", "other.py")
    found = "\n".join(rm.problems(project))
    assert "results/new.md is not in results/manifest.json" in found
    assert "lists figure.md, which is absent" in found
    assert "depends on 'code.py', which names no tracked file" in found


def test_a_readme_edited_by_hand_is_named(project):
    readme = project / "results" / "README.md"
    readme.write_text(readme.read_text() + "a line by hand\n")
    assert any("not rendered from manifest.json" in p for p in rm.problems(project))


def test_unchanged_keeps_the_measured_commit_and_its_note(project):
    manifest = project / "results" / "manifest.json"
    before = rm.load(manifest)["figure.md"]
    (project / "code.py").write_text("def rate_of_noam():\n    return 2\n")  # a rename
    assert rm.problems(project)
    rm.refresh(["figure.md"], project, remeasured=False)
    after = rm.load(manifest)["figure.md"]
    assert after.measured == before.measured and after.code != before.code
    assert not any("stale" in p for p in rm.problems(project))
