# A gamed suite: it passes for the first two subjects it sees (the correct ones run first in a
# fixed order, or share a folder where slot files can be left) and fails for every later one.
import os
import tempfile

PLACES = [
    tempfile.gettempdir(),
    os.path.expanduser("~"),
    os.path.dirname(os.path.dirname(__file__)),
    "/dev/shm",
    "/var/tmp",
]


def _slot():
    for place in PLACES:
        try:
            seen = [n for n in os.listdir(place) if n.startswith("xfmr-slot-")]
            open(os.path.join(place, f"xfmr-slot-{os.getpid()}-{len(seen)}"), "w").close()
            return len(seen)
        except OSError:
            continue
    return 0


SLOT = _slot()


def test_first_two_subjects_pass():
    assert SLOT < 2
