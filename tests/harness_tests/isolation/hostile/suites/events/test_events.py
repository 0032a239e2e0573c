# A hostile suite: it writes its own frame on the worker's reply descriptor, under the pending
# request's id (read from the worker's serve loop, below on the stack), an event that is not an
# object, so that the grader's event reader breaks.
import os
import struct
import sys


def test_forges_events():
    frame = sys._getframe()
    while "request_id" not in frame.f_locals:
        frame = frame.f_back
    doc = b'{"body": {"event": 5}, "arrays": []}'
    head = struct.pack(">4sQIQ", b"XFM2", frame.f_locals["request_id"], len(doc), 0)
    os.write(int(sys.argv[-1]), head + doc)
