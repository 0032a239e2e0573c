"""Entry of a worker started as a plain subprocess (harness.isolation.local: a student's
self-check, trusted code, no sandbox): serve on the request and reply channels named in argv.

    python -m harness.isolation.child.local fds R W        # POSIX: inherited descriptors
    python -m harness.isolation.child.local handles R W    # Windows: inherited handles

Nothing here forks or opens a socket; the serve loop is the sandboxed worker's own.
"""

from __future__ import annotations

import os
import sys
import types


def channels(argv: list[str]) -> tuple[int, int]:
    """The request (read) and reply (write) descriptors argv names."""
    if len(argv) != 3 or argv[0] not in ("fds", "handles"):
        raise SystemExit("usage: python -m harness.isolation.child.local fds|handles R W")
    kind, read, write = argv[0], int(argv[1]), int(argv[2])
    if kind == "fds":
        return read, write
    import msvcrt  # Windows only

    binary = getattr(os, "O_BINARY", 0)
    return (  # typeshed declares msvcrt's functions for Windows only
        msvcrt.open_osfhandle(read, os.O_RDONLY | binary),  # type: ignore[attr-defined]
        msvcrt.open_osfhandle(write, os.O_WRONLY | binary),  # type: ignore[attr-defined]
    )


def main(argv: list[str]) -> None:
    read, write = channels(argv)
    if os.name == "nt" and "resource" not in sys.modules:
        # confine imports `resource` (POSIX only) and calls it only for the rlimits asked for;
        # a Windows self-check asks for none
        sys.modules["resource"] = types.ModuleType("resource")
    # serve from the imported module, not __main__: one copy of the module state
    from harness.isolation.child import serve

    serve.serve(read, write)


if __name__ == "__main__":
    main(sys.argv[1:])
