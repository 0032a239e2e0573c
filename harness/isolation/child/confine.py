"""The worker's own second line, after the sandbox and before the first line of subject code.

The boundary is the sandbox (harness.isolation.sandbox: namespaces, a read-only view without the
project, an unprivileged uid). Inside it the worker still sets its resource limits itself (soft
= hard, so the subject cannot raise them), moves to its private directory, and refuses imports
of the project's packages however they are spelled: they are not there to import, and the
message then says why instead of "No module named".
"""

from __future__ import annotations

import importlib.abc
import os
import resource
import sys
import tempfile
from typing import Any


class ProtectedImport(ImportError):
    """A subject tried to import one of the project's own packages."""


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, protected: tuple[str, ...]) -> None:
        self.protected = protected

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name.split(".")[0] in self.protected:
            raise ProtectedImport(
                f"submissions may not import {name!r}: the packages "
                f"{', '.join(self.protected)} belong to the grader"
            )
        return None


def mapped_bytes() -> int | None:
    """The address space this process has mapped now (VmSize of /proc/self/status); None where
    the system has no such file (macOS, Windows: neither enforces RLIMIT_AS anyway)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def address_space_limit(headroom_mb: int) -> int | None:
    """RLIMIT_AS for a worker that may map `headroom_mb` more than it has mapped now, with
    torch, the probes and the worker's own modules imported: what torch maps at import differs
    by build (measured: 0.6 GiB for 2.13.0+cpu, 3.1 GiB for 2.14.1+cu130, no GPU needed), and
    none of it is the subject's."""
    now = mapped_bytes()
    return None if now is None else now + (int(headroom_mb) << 20)


def confine(spec: dict[str, Any]) -> None:
    """Limits, directory and the import blocker for spec["protected"] (the project's packages,
    named by the parent); cannot be undone from inside. spec["address_space_headroom_mb"]: the
    address space the subject may add to what the worker maps before any subject code runs."""
    for name, (soft, hard) in spec.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    if spec.get("address_space_headroom_mb"):
        limit = address_space_limit(spec["address_space_headroom_mb"])
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if spec.get("dir"):
        os.chdir(spec["dir"])
        tempfile.tempdir = spec["dir"]
    # the worker's own modules keep working through the references they hold; the subject finds
    # none of them in sys.modules and the finder refuses to import them afresh
    protected = tuple(spec.get("protected", ()))
    for name in [m for m in sys.modules if m.split(".")[0] in protected]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Blocker(protected))
