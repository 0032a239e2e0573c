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
# A submission's folder as a package, so that its files' relative imports resolve among them
FOLDER = "xfmr_submission"


def subject(spec: dict[str, Any]) -> ModuleType:
    """{"path": file or package directory, "folder": the submission's folder (optional)} or
    {"source": text, "filename": label}."""
    if "source" in spec:
        return from_source(str(spec["source"]), str(spec.get("filename", "<subject>")))
    if spec.get("folder"):
        return from_folder(Path(spec["folder"]), Path(spec["path"]))
    return from_path(Path(spec["path"]))


def from_folder(folder: Path, path: Path) -> ModuleType:
    """A submission of several files: `path` (its main module, in `folder`) imported with the
    folder first on sys.path, so `import schedule` finds the student's own schedule.py, and as a
    module of the package FOLDER (the folder), so `from .schedule import x` does too."""
    sys.path.insert(0, str(folder))
    package = ModuleType(FOLDER)
    package.__path__ = [str(folder)]
    package.__file__ = None
    package.__package__ = FOLDER
    package.__spec__ = importlib.util.spec_from_loader(FOLDER, None, is_package=True)
    # never None: spec_from_loader makes a spec whenever the loader is None (typeshed: Optional)
    package.__spec__.submodule_search_locations = [str(folder)]  # type: ignore[union-attr]
    sys.modules[FOLDER] = package
    if path.is_dir():
        return from_path(path)
    spec = importlib.util.spec_from_file_location(f"{FOLDER}.{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
