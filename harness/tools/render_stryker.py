"""Render a Stryker report in the real viewer, headless, and keep a screenshot:
`python -m harness.tools.render_stryker REPORT.json --elements mutation-test-elements.js --out PNG`.

The viewer is Stryker's own web component (npm: mutation-testing-elements, its standalone bundle
dist/mutation-test-elements.js); the browser is Chromium, headless. A staff check that the report
renders as the CLI counts it (results/mutants/stryker_report.png), not a test: neither is installed
by CI.

    npm pack mutation-testing-elements@3.9.0 && tar -xzf mutation-testing-elements-3.9.0.tgz
    apt-get install -y chromium
    xfmr matrix --stryker stryker.json
    python -m harness.tools.render_stryker stryker.json \\
        --elements package/dist/mutation-test-elements.js --out results/mutants/stryker_report.png
    (--view test: the tests tab, results/mutants/stryker_tests.png)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# As this machine's notes advise for headless Chromium as root on a closed network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def page(report: dict, elements_js: str) -> str:
    """A self-contained HTML page: the viewer's bundle inline, the report handed to it."""
    data = json.dumps(report).replace("</", "<\\/")  # never close the script element early
    script = elements_js.replace("</script", "<\\/script")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>xfmr: Stryker report</title></head>
<body><mutation-test-report-app title-postfix="xfmr-oracle"></mutation-test-report-app>
<script>{script}</script>
<script>document.querySelector("mutation-test-report-app").report = {data};</script>
</body></html>
"""


def render(
    report: Path, elements: Path, out: Path, view: str = "", size: str = "1400,1100"
) -> None:
    """Screenshot the viewer at `view` (its own route: "" for the summary, "test" for the tests,
    "mutant/impl/transformer.py" for the source with every mutant)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("render_stryker: chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        html.write_text(page(json.loads(report.read_text()), elements.read_text()))
        cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile"]
        cmd += [f"--window-size={size}", "--virtual-time-budget=10000"]
        cmd += [f"--screenshot={out.resolve()}", html.as_uri() + (f"#{view}" if view else "")]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    if not out.exists() or out.stat().st_size == 0:
        raise SystemExit(f"render_stryker: chromium wrote no screenshot at {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a Stryker report (xfmr matrix --stryker)")
    parser.add_argument("--elements", type=Path, required=True, help="mutation-test-elements.js")
    parser.add_argument("--out", type=Path, required=True, help="the screenshot (PNG)")
    parser.add_argument("--view", default="", help="the viewer's route, e.g. test")
    args = parser.parse_args(argv)
    render(args.report, args.elements, args.out, args.view)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
