"""A mutant as data: exact-text patches on a subject's source, each applying exactly once."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass


class PatchError(Exception):
    """A mutant's patch no longer applies: its text is missing or ambiguous in the source."""


@dataclass(frozen=True)
class Patch:
    """Replace `old` by `new`; `old` must occur exactly once in the source."""

    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One pitfall: the sentence that names it, the tests that must kill it, and the change.

    The change is a list of exact-text patches applied in order, then `append` (module-level
    code added at the end, for a change that wraps names rather than edits lines).
    """

    id: str
    mutator: str  # a short category name for reports (Stryker's mutatorName)
    pitfall: str
    killers: tuple[str, ...]  # the seed's expected killing test(s); more killers are fine
    patches: tuple[Patch, ...] = ()
    append: str = ""
    target: str = "impl.transformer"  # the module whose source is patched
    # a student's suite must kill it to pass `xfmr mutation-score` (the seed's rung R5: s01-s08)
    required: bool = False
    # the contract clause a generated mutant breaks (mutants.generated_catalog.CLAUSES' key)
    clause: str = ""
    # the def or class of the target the change lies in, by qualified name (`Class.method`, or
    # `<module>`): a generated mutant's scope (mutants.generated)
    function: str = ""

    def apply(self, source: str) -> str:
        """The mutated source; a PatchError names this mutant and the text that failed."""
        for i, patch in enumerate(self.patches):
            count = source.count(patch.old)
            if count != 1:
                where = "not found" if count == 0 else f"found {count} times"
                raise PatchError(
                    f"mutant {self.id}: patch {i + 1} of {len(self.patches)} must match exactly "
                    f"once in {self.target}'s source, but its text was {where}:\n{patch.old}"
                )
            source = source.replace(patch.old, patch.new)
        if self.append:
            source = source.rstrip("\n") + "\n\n" + self.append.strip("\n") + "\n"
        return source

    def change(self) -> tuple[str, str]:
        """What the first patch changes, read from its text alone: its old and new text less
        their common start and end, widened to whole words (`tril` -> `triu`, not `l` -> `u`)."""
        if not self.patches:
            return "", self.append
        old, new = self.patches[0].old, self.patches[0].new
        a = len(os.path.commonprefix([old, new]))
        z = len(os.path.commonprefix([old[a:][::-1], new[a:][::-1]]))
        while a > 0 and _word(old[a - 1]):
            a -= 1
        while z > 0 and _word(old[len(old) - z]):
            z -= 1
        return old[a : len(old) - z], new[a : len(new) - z]

    def diff(self, source: str, path: str = "impl/transformer.py") -> str:
        """The change as a unified diff of the target's source."""
        lines = difflib.unified_diff(
            source.splitlines(keepends=True),
            self.apply(source).splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path} ({self.id})",
        )
        return "".join(lines)

    def locations(self, source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Where each patch lands in the original source: ((line, col), (line, col)), both from
        1, end exclusive (Stryker's convention); an append lands at the end of the file."""
        spans = []
        for patch in self.patches:
            start = source.index(patch.old)
            spans.append((_line_col(source, start), _line_col(source, start + len(patch.old))))
        if self.append:
            end = _line_col(source, len(source))
            spans.append((end, end))
        return spans

    def span(self, source: str) -> tuple[tuple[int, int], tuple[int, int], str]:
        """One region of the original source covering every patch (and an append), as
        ((line, col), (line, col)) from 1, end exclusive, and what the mutant puts there: a
        report that shows one location per mutant still shows all of its change."""
        edits = [(source.index(p.old), source.index(p.old) + len(p.old)) for p in self.patches]
        start = min((a for a, _ in edits), default=len(source))
        end = len(source) if self.append else max((b for _, b in edits), default=len(source))
        mutated = self.apply(source)
        replacement = mutated[start : len(mutated) - (len(source) - end)]
        return _line_col(source, start), _line_col(source, end), replacement


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"
