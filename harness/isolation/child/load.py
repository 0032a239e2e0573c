"""Loading a subject inside the worker, from what the parent sent: a path or a source text.

The parent never sends a module name to import: impl, the torch copy and the mutants arrive as
source text (a mutant already patched), so a worker needs none of the project's packages.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

MODULE = "xfmr_subject"  # the name every subject is loaded under


def subject(spec: dict[str, Any]) -> ModuleType:
    """{"path": file or package directory} or {"source": text, "filename": label}."""
    if "source" in spec:
        return from_source(str(spec["source"]), str(spec.get("filename", "<subject>")))
    return from_path(Path(spec["path"]))


def from_source(source: str, filename: str, name: str = MODULE) -> ModuleType:
    """Execute `source` as a fresh module registered under `name`."""
    module = ModuleType(name)
    module.__file__ = filename
    # registered before running, as an import would: dataclasses look their module up by name
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def from_path(path: Path, name: str = MODULE) -> ModuleType:
    """Import a .py file or a package directory (its __init__.py) as `name`."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
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
