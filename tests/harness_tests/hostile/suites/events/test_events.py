# A hostile suite: it writes its own frames on the worker's reply descriptor, an event that is
# not an object and then a result for a test that does not exist, so that the grader's event
# reader breaks.
import os
import struct
import sys


def test_forges_events():
    doc = b'{"body": {"event": 5}, "arrays": []}'
    os.write(int(sys.argv[-1]), struct.pack(">4sIQ", b"XFM1", len(doc), 0) + doc)
