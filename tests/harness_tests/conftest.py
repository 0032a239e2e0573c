"""tests/harness_tests mirrors harness/: a folder per subpackage (engine/, isolation/, jobs/,
reports/, shared_tests/, tools/), the tests of harness's top-level modules here. The real-world
set (realworld/) is read by tests in several of them, so this folder is on sys.path for all."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
