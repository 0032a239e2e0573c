"""`xfmr check`'s warm path: each check's workers fork afresh from one warm server that never
imported a submission, so nothing one check's submission planted is seen by the next."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from harness.isolation import warm
from harness.isolation.forkserver import worker_environment
from harness.shared_tests.laws import BY_NAME
from harness.students import selfcheck

ROOT = Path(__file__).resolve().parents[3]
CORRECT = (ROOT / "examples" / "correct_submission.py").read_text()
QUICK = [BY_NAME["test_hand_example_noam"]]

PLANT = """
import json as _json, os as _os, sys as _sys, types as _types
import numpy as _np
import torch as _torch
_np.xfmr_planted = 1
_sys.modules["xfmr_planted"] = _types.ModuleType("xfmr_planted")
_torch.manual_seed(1234)
_torch.set_default_dtype(_torch.float64)
_torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
"""
SEE = """
import json as _json, os as _os, sys as _sys
import numpy as _np
import torch as _torch
with open({out!r}, "w") as _f:
    _json.dump({{
        "numpy": hasattr(_np, "xfmr_planted"),
        "module": "xfmr_planted" in _sys.modules,
        "seed": _torch.initial_seed(),
        "dtype": str(_torch.get_default_dtype()),
        "hooks": len(_torch.nn.modules.module._global_forward_hooks),
        "server": int(open(f"/proc/{{_os.getppid()}}/stat").read().rsplit(")", 1)[1].split()[1]),
    }}, _f)
"""


@pytest.fixture
def runtime(monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="xc-", dir="/tmp"))
    monkeypatch.setenv("XFMR_RUNTIME_DIR", str(folder))
    monkeypatch.delenv(selfcheck.WARM_SWITCH, raising=False)
    yield folder
    warm.stop(worker_environment(), folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_state_planted_by_one_check_is_not_seen_by_the_next(runtime, tmp_path):
    seen = [tmp_path / "seen1.json", tmp_path / "seen2.json"]
    first = tmp_path / "one" / "transformer.py"
    first.parent.mkdir()
    first.write_text(CORRECT + PLANT + SEE.format(out=str(seen[0])))
    second = tmp_path / "two" / "transformer.py"
    second.parent.mkdir()
    second.write_text(CORRECT + SEE.format(out=str(seen[1])))
    selfcheck.check(first, QUICK)
    server = warm.status(worker_environment())
    assert server is not None and server["stale"] is None
    g = selfcheck.check(second, QUICK)
    assert g.passed, g.tests
    one, two = (json.loads(p.read_text()) for p in seen)
    # run 1 planted it in its own process ...
    assert one["numpy"] and one["module"] and one["seed"] == 1234
    assert one["dtype"] == "torch.float64" and one["hooks"] >= 1
    # ... and run 2, forked from the same warm server, sees none of it
    assert one["server"] == two["server"] == server["pid"]
    assert not two["numpy"] and not two["module"] and two["seed"] != 1234
    assert two["dtype"] == "torch.float32" and two["hooks"] == 0
    # the student's folder got no bytecode (python -B, as a plain subprocess)
    assert not (second.parent / "__pycache__").exists()


@pytest.mark.slow
def test_cold_checks_start_no_warm_server(runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(selfcheck.WARM_SWITCH, "0")
    assert selfcheck.check(ROOT / "examples" / "correct_submission.py", QUICK).passed
    assert warm.status(worker_environment()) is None
