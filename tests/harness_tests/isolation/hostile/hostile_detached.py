# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: leave a detached process behind (fork, setsid, fork again) that keeps every inherited
# descriptor open, the grader's pipes included, then exit with status 0 mid-test: a grader
# waiting for end-of-file on its pipe would wait forever. Fault: Noam counted from n = step.
import os as _os


def _detach():
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork() == 0:
            for fd in range(3, 64):
                try:
                    _os.set_inheritable(fd, True)
                except OSError:
                    pass
            _os.execv("/bin/sleep", ["sleep", "4242.5"])
        _os._exit(0)


def noam_rate(step, d_model, warmup, factor=1.0):
    _detach()
    n = max(step, 1e-12)
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def _detach_and_exit(self, *args, **kwargs):
    _detach()
    _os._exit(0)


Transformer.forward = _detach_and_exit
