# Attack: reach the reference where a static check cannot see it: a computed module name, then
# reading the reference's source to exec it. Fault: whatever it gets, the grade must fail.
import importlib as _importlib
import os as _os

_found = []
try:
    _importlib.import_module("im" + "pl.transformer")
except ImportError as _e:
    _found.append(f"{type(_e).__name__}: {_e}")
_project = "__PROJECT__"  # the grader's install, which is no secret (the test fills it in)
try:
    exec(open(_os.path.join(_project, "im" + "pl", "transformer.py")).read(), {"__name__": "_x"})
except OSError as _e:
    _found.append(f"{type(_e).__name__}: {_e}")
raise RuntimeError("; ".join(_found))
