"""A class folder as grade-batch reads it: every entry directly in it accounted for, and each
entry's output files named so that no two entries can share one.

Each entry (`entries`, by name; links are never followed) is either a **submission**, which
grade() grades or rejects with its reason, or **not a submission**, named with its reason and
never graded:

- a regular file `*.py`: a submission;
- a folder holding anything: a submission (grade() rejects one that is neither a package nor
  a folder holding transformer.py, with the reason);
- a name starting with `.` (`.DS_Store`, `.git`): not a submission, hidden;
- a name starting with `__` (`__pycache__`, `__MACOSX`, `__init__.py`): not a submission,
  Python's or an archive's own;
- a symbolic link, to anything: not a submission (the grader reads nothing outside the folder);
- an empty folder: not a submission;
- an archive (`.zip`, `.tar`, `.tar.gz`, `.tgz`, `.7z`, `.rar`, ...): not a submission, to be
  unpacked into a folder of its own;
- a notebook (`.ipynb`): not a submission, to be exported as a .py file;
- any other file (a PDF, notes, `X.PY`): not a submission;
- a FIFO, a socket, a device: not a submission.

Output names (`output_stems`): each entry's name percent-encoded, every character but `a-z`,
`0-9`, `-`, `_` and a `.` that does not lead written as `%XX` of its UTF-8 bytes (lower-case
hex; a name the file system could not decode by its original bytes). The encoding is
reversible (urllib.parse.unquote gives the name back), so two names give two stems; and the
stems are lower-case ASCII, so neither a case-insensitive file system (`F.py`, `f.py`) nor one
that normalises Unicode (é as one code point or two) can merge two of them. A stem longer
than `MAX_STEM` keeps a prefix cut between characters and ends in `%%` and the entry's index:
no plain stem holds `%%`, and no two entries share an index. Every output file is a stem plus
a fixed suffix (`.gradescope.json`, `.student.html`) that none of the class files (grades.csv,
hardest_tests.csv, report.html) ends in.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SUBMISSION = "submission"
NOT_A_SUBMISSION = "not a submission"
# Kept as written in an output name; anything else is %XX (a leading "." too: no hidden file).
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")
MAX_STEM = 160  # bytes: with the longest suffix and an index, well under NAME_MAX (255)
ARCHIVES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".7z", ".rar")  # .tar.gz: .gz


@dataclass(frozen=True)
class Entry:
    """One entry directly in a class folder: a submission, or not one with the reason."""

    path: Path
    reason: str = ""  # why it is not a submission ("" for a submission)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def submission(self) -> bool:
        return not self.reason

    @property
    def kind(self) -> str:
        return SUBMISSION if self.submission else NOT_A_SUBMISSION


def why_not(path: Path) -> str:
    """Why the entry at `path` is not a submission, or "" if it is one (see the module's table)."""
    name = path.name
    if name.startswith("."):
        return "hidden (its name starts with a dot)"
    if name.startswith("__"):
        return "its name starts with __ (Python's or an archive's own: __pycache__, __MACOSX)"
    try:
        mode = path.lstat().st_mode
    except OSError as e:  # gone meanwhile, or not ours to read
        return f"cannot be read: {e.strerror or e}"
    if stat.S_ISLNK(mode):
        return (
            "a symbolic link: links are not followed (the grader reads nothing outside the "
            "folder); put the file or folder itself here"
        )
    if stat.S_ISDIR(mode):
        try:
            with os.scandir(path) as listing:
                empty = next(listing, None) is None
        except OSError:
            return ""  # a submission: grade() says why it cannot be read
        return "an empty folder" if empty else ""
    if not stat.S_ISREG(mode):
        return "not a regular file or a folder (a FIFO, a socket or a device)"
    lower = name.lower()
    if name.endswith(".py"):
        return ""
    if lower.endswith(".py"):
        return "a .py file by another case: name it .py to grade it"
    if lower.endswith(ARCHIVES):
        return "an archive: unpack it into a folder of its own to grade it"
    if lower.endswith(".ipynb"):
        return "a notebook: export it as a .py file to grade it"
    suffix = "".join(Path(lower).suffixes[-1:])
    what = f"a {suffix} file" if suffix else "a file without a suffix"
    return f"{what}, not a .py file or a folder"


def entries(folder: Path) -> list[Entry]:
    """Every entry directly in `folder`, by name, each a submission or not one with why."""
    return [Entry(p, why_not(p)) for p in sorted(folder.iterdir(), key=lambda p: p.name)]


def _tokens(name: str) -> list[str]:
    tokens = []
    for i, c in enumerate(name):
        if c in _KEPT and not (i == 0 and c == "."):
            tokens.append(c)
        else:  # surrogateescape: an undecodable byte of the name is that byte again
            tokens.append("".join(f"%{b:02x}" for b in c.encode("utf-8", "surrogateescape")))
    return tokens


def output_stem(name: str, index: int) -> str:
    """The stem of `name`'s output files, the entry at `index` of its folder (see the module)."""
    tokens = _tokens(name)
    if sum(map(len, tokens)) <= MAX_STEM:
        return "".join(tokens)
    tail = f"%%{index}"
    kept, size = [], 0
    for token in tokens:
        if size + len(token) > MAX_STEM - len(tail):
            break
        kept.append(token)
        size += len(token)
    return "".join(kept) + tail


def output_stems(names: Sequence[str]) -> list[str]:
    """Each name's stem, by its index among `names` (a folder's entries: distinct names)."""
    return [output_stem(name, i) for i, name in enumerate(names)]
