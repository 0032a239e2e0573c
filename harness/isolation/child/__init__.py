"""Everything that runs inside a worker process: the serve loop, the second-line confinement,
loading a subject, and the probes that call its contract API. Nothing here judges, and nothing
here imports the judge: a worker holds neither the oracle nor the tests nor the reference.

This package, harness/__init__.py and harness/wire.py are all of the project a sandboxed worker
can see (harness.isolation.sandbox mounts exactly these files).
"""
