"""`python -m harness` is the `xfmr` command."""

import sys

from harness.cli import main

sys.exit(main())
