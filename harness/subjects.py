"""Subjects as data: what to run the tests on, and how a worker loads it.

A subject spec is plain JSON-able data, so the parent can write it into reports and turn it into
what a worker loads (`payload`). Loading happens only in the worker: the parent never imports a
subject.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class Kind(enum.Enum):
    """What a subject is, which decides how its cells count."""

    CORRECT = "correct"  # must pass every applicable test: a failure is a false alarm
    MUTANT = "mutant"  # a pitfall: some test must kill it
    SANITY = "sanity"  # every contract function raises: every test must kill it
    SUBMISSION = "submission"  # untrusted code under grading


@dataclass(frozen=True)
class Subject:
    """One subject: a name, a kind, and exactly one way to load it.

    module: an importable module name (impl.transformer). path: a .py file or a package
    directory. mutant: a mutant id from mutants/, applied to the source of `module`.
    """

    name: str
    kind: Kind
    module: str | None = None
    path: str | None = None
    mutant: str | None = None

    def __post_init__(self) -> None:
        if (self.module is None) == (self.path is None):
            raise ValueError(f"subject {self.name!r}: give exactly one of module= and path=")
        if self.mutant is not None and self.module is None:
            raise ValueError(f"subject {self.name!r}: a mutant patches a module's source")

    @property
    def is_correct(self) -> bool:
        return self.kind is Kind.CORRECT

    def payload(self) -> dict[str, Any]:
        """What a worker loads (harness.isolation.child.load): a module's source text, patched
        here for a mutant, so no worker ever imports the project's packages; or a path."""
        if self.module is None:
            return {"path": self.path}
        path, source = module_source(self.module)
        if self.mutant is not None:
            from mutants import catalog

            source = catalog.get(self.mutant).apply(source)
            path = f"{path} [mutant {self.mutant}]"
        return {"source": source, "filename": path}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Subject:
        return cls(**{**data, "kind": Kind(data["kind"])})


def module_source(module: str) -> tuple[str, str]:
    """(path, text) of an importable module's source file, without importing it; in the
    student kit, where impl and the torch copy have no source file, their sealed text
    (harness.sealed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        from harness import sealed

        if (found := sealed.module_text(module)) is not None:
            return found
        raise ImportError(f"no Python source found for module {module!r}")
    return spec.origin, Path(spec.origin).read_text()
