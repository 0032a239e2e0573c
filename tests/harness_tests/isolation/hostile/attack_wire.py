# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: forge the worker's replies on its reply descriptor (argv of the worker), under the
# pending request's id (read from the worker's memory), so that the grader's own parser or checks
# break: a 100 000-deep JSON tree, a 5000-digit integer, strings and a 1-D table where arrays
# belong. Fault: nothing computes what it claims.
import json as _json
import os as _os
import struct as _struct
import sys as _sys


def _forge(doc: bytes) -> None:
    fd = int(_sys.argv[-1])
    frame = _sys._getframe()
    while "request_id" not in frame.f_locals:  # the worker's serve loop, below on the stack
        frame = frame.f_back
    frame_id = frame.f_locals["request_id"]
    _os.write(fd, _struct.pack(">4sQIQ", b"XFM2", frame_id, len(doc), 0) + doc)
    _os._exit(0)


def noam_rate(step, d_model, warmup, factor=1.0):
    _forge(
        b'{"body": {"ok": true, "value": ' + b"[" * 100_000 + b"]" * 100_000 + b'}, "arrays": []}'
    )


def label_smoothed_loss(logits, targets, eps, pad_id):
    _forge(b'{"body": {"ok": true, "value": {"loss": ' + b"7" * 5000 + b'}}, "arrays": []}')


_Base = Transformer


class Transformer(_Base):
    def forward(self, *args):
        value = {
            "dtype": "float64",
            "state_dict": {"src_emb.weight": [1.0, 2.0]},
            "logits": "all correct",
            "loss": "0",
            "grads": "none",
            "outputs": {"encoder.0": "a string"},
        }
        _forge(_json.dumps({"body": {"ok": True, "value": value}, "arrays": []}).encode())
