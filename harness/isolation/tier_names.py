"""The isolation tiers' names and what every report says of how a run's workers ran: plain
strings at the bottom of the imports, so that a record (harness.records.Grade's default) names a
tier without loading the sandbox. The tier records (harness.isolation.tiers) take theirs from
here; these strings are what reports and JSON carry, so a change here changes every report.
"""

from __future__ import annotations

SANDBOX = "sandbox"  # --isolation's values
CONTAINER = "container"
UNSAFE = "unsafe"  # --unsafe-no-sandbox: trusted code without either tier, never an --isolation

DESCRIBED = {
    SANDBOX: "bubblewrap sandbox, one per worker",
    CONTAINER: "container tier: a dedicated unprivileged user, no namespaces "
    "(--isolation container)",
    UNSAFE: "UNSAFE: no sandbox (--unsafe-no-sandbox); for trusted code only",
}
