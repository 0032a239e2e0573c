# Attack: reach the reference where a static check cannot see it: a computed module name, then
# reading the reference's source to exec it. Fault: whatever it gets, the grade must fail.
import importlib as _importlib
import os as _os
import sys as _sys

_found = []
try:
    _importlib.import_module("im" + "pl.transformer")
except ImportError as _e:
    _found.append(f"{type(_e).__name__}: {_e}")
_project = _os.path.dirname(_os.path.dirname(_sys.modules["__main__"].__file__))
try:
    exec(open(_os.path.join(_project, "im" + "pl", "transformer.py")).read(), {"__name__": "_x"})
except OSError as _e:
    _found.append(f"{type(_e).__name__}: {_e}")
raise RuntimeError("; ".join(_found))
