"""What the student kit (`xfmr kit`, harness.jobs.kit) carries in place of the reference.

In the project's own install (a checkout, `pip install -e .`) there is no kit manifest, and
nothing here changes what any command does: text() reads the project's files as before.

In the kit (a wheel built by `xfmr kit` and installed by a student) the reference is never on
the student's disk as source or plain text:
- the texts the students' commands need as text are one sealed blob, harness/data/
  reference.sealed: impl/transformer.py (the canary's known-correct subject, harness.canary;
  with impl/torch_copy.py a subject of `xfmr check --suite`) and mutants/generated_catalog.json;
- the modules that hold reference (oracle/, the mutants' catalogs) are sourceless bytecode whose
  string constants are one sealed blob each, read by strings() when the module is imported;
- harness/data/kit.json (the manifest) names the commands the kit offers and the interpreter its
  bytecode was compiled for; refusal() says why any other command or interpreter cannot run.

"Sealed" is zlib, then an xor with a fixed key: `strings`, grep and unzip show nothing of the
reference, and that is all it claims. The key is below and the code that reads the blobs ships
with them: a student who runs or disassembles the kit recovers every text (README: what a
determined student can still recover).
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from functools import cache
from pathlib import Path
from typing import Any

KEY = hashlib.sha256(b"xfmr-oracle student kit: not a secret").digest()
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().with_name("data")
MANIFEST = DATA / "kit.json"  # present in the kit only
BLOB = DATA / "reference.sealed"


def _xor(data: bytes) -> bytes:
    stream = (KEY * (len(data) // len(KEY) + 1))[: len(data)]
    mixed = int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")
    return mixed.to_bytes(len(data), "little")


def seal(data: bytes) -> bytes:
    return _xor(zlib.compress(data, 9))


def unseal(blob: bytes) -> bytes:
    return zlib.decompress(_xor(blob))


def strings(blob: bytes) -> tuple[str, ...]:
    """A sealed module's string constants, in the order its bytecode indexes them."""
    return tuple(json.loads(unseal(blob)))


def seal_strings(values: list[str]) -> bytes:
    return seal(json.dumps(values).encode())


@cache
def manifest() -> dict[str, Any] | None:
    """The kit's manifest; None in the project's own install."""
    try:
        found = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def in_kit() -> bool:
    return manifest() is not None


@cache
def sealed_texts() -> dict[str, str]:
    """The kit's sealed texts by their path in the project ({} outside the kit)."""
    try:
        found = json.loads(unseal(BLOB.read_bytes()))
    except (OSError, ValueError, zlib.error):
        return {}
    return found if isinstance(found, dict) else {}


def text(rel: str) -> str | None:
    """The project file `rel` (a path from the project's root, `impl/transformer.py`): read
    from the project where it is there (the project's own install), else from the kit's sealed
    blob; None where neither has it."""
    path = PROJECT_ROOT / rel
    if path.is_file():
        return path.read_text()
    return sealed_texts().get(rel)


def module_text(module: str) -> tuple[str, str] | None:
    """(path, text) of a module whose source the kit carries sealed (impl.transformer,
    impl.torch_copy), where it has no .py file; None otherwise."""
    rel = module.replace(".", "/") + ".py"
    found = sealed_texts().get(rel)
    return None if found is None else (str(PROJECT_ROOT / rel), found)


def interpreter() -> str:
    return f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}"


def offers(command: str, module: str = "") -> bool:
    """Does this install offer `command` (run by `module`, where given: the kit's milestone is
    the students' own-model run, not the course's demo on impl)? Every one in the project's own
    install."""
    found = manifest()
    if found is None:
        return True
    commands = found.get("commands", {})
    return command in commands and (not module or commands[command] == module)


def refusal(command: str) -> str:
    """Why `command` cannot run here ("" where it can): in the kit, a staff command, or an
    interpreter other than the one its bytecode was compiled for."""
    found = manifest()
    if found is None:
        return ""
    built = found.get("interpreter", "")
    if built != interpreter():
        return (
            f"this student kit was built for {built} (its reference modules are bytecode of "
            f"that interpreter) and this is {interpreter()}: install the kit into a "
            f"{built} environment"
        )
    if not offers(command):
        return (
            f"`xfmr {command}` is a staff command, not part of the student kit (its commands: "
            f"{', '.join(found.get('commands', {}))}); staff run it from the project's own "
            "install"
        )
    return ""
