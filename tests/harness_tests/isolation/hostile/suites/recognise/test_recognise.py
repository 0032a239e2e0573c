# A gamed suite: it recognises the correct subjects by their text (the ast-normalized source the
# old harness handed over, whose hashes it carries) and fails every other subject.
import ast
import hashlib
import inspect

import tinyllm.xfmr.transformer as subject

KNOWN = set("__HASHES__".split(","))


def _digest():
    text = ast.unparse(ast.parse(inspect.getsource(subject)))
    return hashlib.sha256(text.encode()).hexdigest()


def test_is_a_correct_subject():
    assert _digest() in KNOWN
