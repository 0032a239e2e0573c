"""Subjects as data: what to run the tests on, and how a worker loads it.

A subject spec is plain JSON-able data, so the parent can send it to a worker and write it into
reports. Loading happens only in the worker: the parent never imports a subject.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
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

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Subject:
        return cls(**{**data, "kind": Kind(data["kind"])})


def module_source(module: str) -> tuple[str, str]:
    """(path, text) of an importable module's source file, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ImportError(f"no Python source found for module {module!r}")
    return spec.origin, Path(spec.origin).read_text()


def load(subject: Subject) -> ModuleType:
    """Import the subject's module (in the worker). Mutants get a fresh module name."""
    if subject.mutant is not None:
        from mutants import catalog

        path, source = module_source(subject.module)
        patched = catalog.get(subject.mutant).apply(source)
        name = f"xfmr_mutant_{subject.mutant}"
        return _exec_source(name, patched, f"{path} [mutant {subject.mutant}]")
    if subject.module is not None:
        return importlib.import_module(subject.module)
    return _load_path(Path(subject.path))


def _exec_source(name: str, source: str, filename: str) -> ModuleType:
    module = ModuleType(name)
    module.__file__ = filename
    # registered before running, as an import would: dataclasses look their module up by name
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _load_path(path: Path) -> ModuleType:
    name = "xfmr_submission"
    if path.is_dir():
        init = path / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(path)]
        )
    elif path.suffix == ".py":
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        raise ImportError(f"a submission is a .py file or a package directory, got {path}")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
