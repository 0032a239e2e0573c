# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: forge the worker's replies on its reply descriptor (argv of the worker) so that the
# grader's own parser or checks break: a 100 000-deep JSON tree, a 5000-digit integer, strings
# and a 1-D table where arrays belong. Fault: nothing computes what it claims.
import json as _json
import os as _os
import struct as _struct
import sys as _sys


def _forge(doc: bytes) -> None:
    fd = int(_sys.argv[-1])
    _os.write(fd, _struct.pack(">4sIQ", b"XFM1", len(doc), 0) + doc)
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
