"""`xfmr warm-server start|status|stop`: the warm fork server that `xfmr matrix --incremental`
keeps between runs (harness.isolation.warm).

start: start one now (or check that the running one is current), so the next run forks its first
worker at once; status: whether one runs, its pid, and whether it runs the code on disk (exit
status 1 if none runs); stop: stop it.

An operations command (`xfmr --help`: operations): it starts and stops a piece of the process
boundary, so it lives beside that piece (warm.py, forkserver.py) rather than among the
measurements of harness/tools/.
"""

from __future__ import annotations

import argparse
import sys

from harness.isolation import warm
from harness.isolation.forkserver import worker_environment


def configure_warm_server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument(
        "--idle",
        type=float,
        default=10.0,
        metavar="MINUTES",
        help="start: exit after MINUTES with no run connected (default 10)",
    )


def run_warm_server(args: argparse.Namespace) -> int:
    env = worker_environment()
    try:
        if args.action == "start":
            conn = warm.connect(env, 60.0 * args.idle)
            conn.sock.close()
            how = "started" if conn.started else "already running, current"
            why = f" (replaced a stale one: {conn.replaced})" if conn.replaced else ""
            print(f"warm fork server: pid {conn.pid}, {how}{why}")
            return 0
        if args.action == "status":
            about = warm.status(env)
            if about is None:
                print(f"no warm fork server runs ({warm.place(env).socket})")
                return 1
            state = f"stale: {about['stale']}" if about["stale"] else "current"
            print(f"warm fork server: pid {about['pid']}, {state}, at {about['socket']}")
            print(f"  {len(about['files'])} project files and {len(about['libraries'])} "
                  f"packages imported")  # fmt: skip
            return 0
        pid = warm.stop(env)
        print("no warm fork server ran" if pid is None else f"stopped the warm fork server {pid}")
        return 0
    except warm.Refused as e:
        print(f"xfmr warm-server: refused: {e}", file=sys.stderr)
        return 2
