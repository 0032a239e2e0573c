"""tests/harness_tests mirrors harness/: a folder per subpackage (engine/, isolation/, jobs/,
oracle_checks/, reports/, shared_tests/, students/, tools/), the tests of harness's top-level
modules here. The real-world set (realworld/) is read by tests in several of them, so this
folder is on sys.path for all."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


import pytest  # noqa: E402


@pytest.fixture
def proven(monkeypatch):
    """For tests whose workers are stand-ins (no real worker runs): the environment counts as
    proven (harness.canary), as a real one is once a correct model passed through it."""
    from harness import canary

    monkeypatch.setattr(canary, "prove", lambda environment, run: "")
