"""Generated mutants' names: by scope and ordinal, never by line, so that lines added elsewhere in
impl rename nothing (mutants.generated's docstring), and every name the committed artifacts use
is one the generator gives for impl's current text."""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

import pytest

from harness.subjects import module_source
from mutants import generated_catalog
from mutants.generated import HAND, MODULE, generate, hand_mutants
from mutants.patch import Mutant

_, IMPL = module_source("impl.transformer")
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "mutants"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# operator@scope#ordinal:replacement; the replacement is free text after the first colon
GENERATED = re.compile(rf"(?P<op>[a-z_]+)@(?P<scope><module>|{_NAME}(?:\.{_NAME})*)#(?P<n>\d+):")
HAND_ID = re.compile(r"hand_[a-z0-9_.]+")
# a key of the old form: operator@line:col[:text], or hand_...@line
LINE_KEY = re.compile(r"[a-z_]+@\d+")

# impl's text just before its first class: after the imports, near the top
TOP = IMPL.index("\n@dataclass\nclass TransformerConfig") + 1
ADDED = '''def _added_by_a_test(a: float, b: float = 2.0) -> float:
    """A new small function near the top: its own mutants, and no other's renamed."""
    if a > 0 and b != 1:
        return a * b + 1
    return -a


'''
# the start of a line inside a function in the middle of impl (fit's loop)
IN_FIT = IMPL.rindex("\n", 0, IMPL.index("for step in range(steps):")) + 1


@cache
def _generated(source: str) -> dict[str, Mutant]:
    return {m.id: m for m in generate(source)}


def _key_prefix(key: str) -> str:
    return key.split(":", 1)[0]


def test_no_generated_key_holds_a_line_number():
    keys = list(_generated(IMPL))
    assert len(keys) > 1000
    for key in keys:
        match = GENERATED.match(key)
        assert match, key
        assert not LINE_KEY.match(key), key
    # the ordinal counts an operator's mutants in a scope from 1, in source order
    by_scope: dict[tuple[str, str], list[int]] = {}
    for key in keys:
        match = GENERATED.match(key)
        assert match
        by_scope.setdefault((match["op"], match["scope"]), []).append(int(match["n"]))
    for ordinals in by_scope.values():
        assert ordinals == list(range(1, len(ordinals) + 1))
    assert ("statement_deletion", "MultiHeadAttention.forward") in by_scope


def test_keys_on_a_small_source_name_module_class_method_and_decorated_def():
    source = "X = 1\n\nclass A:\n    def f(self, y=2):\n        return y + X\n\n"
    source += "@dec(3)\ndef g():\n    return X\n"
    assert [m.id for m in generate(source)] == [
        f"statement_deletion@{MODULE}#1:pass",
        f"number_replacer@{MODULE}#1:0",
        f"number_replacer@{MODULE}#2:2",
        "number_replacer@A.f#1:1",  # a default belongs to its def
        "number_replacer@A.f#2:3",
        "statement_deletion@A.f#1:pass",
        "binary_operator_replacement@A.f#1:(y % X)",  # one node: by replacement
        "binary_operator_replacement@A.f#2:(y * X)",
        "binary_operator_replacement@A.f#3:(y ** X)",
        "binary_operator_replacement@A.f#4:(y - X)",
        "binary_operator_replacement@A.f#5:(y / X)",
        "binary_operator_replacement@A.f#6:(y // X)",
        "remove_decorator@g#1:",  # so does a decorator
        "number_replacer@g#1:2",
        "number_replacer@g#2:4",
        "statement_deletion@g#1:pass",
    ]


def test_a_mutants_scope_is_its_def_by_the_tree():
    mutants = _generated(IMPL)
    for key, m in mutants.items():
        match = GENERATED.match(key)
        assert match and m.function == match["scope"], key
    # a decorator belongs to the def it decorates, not to the module around it
    decorators = [m for m in mutants.values() if m.mutator == "remove_decorator"]
    assert decorators and all(m.function != MODULE for m in decorators)
    assert "remove_decorator@translate#1:" in mutants


def test_hand_mutants_are_named_by_their_records_without_a_line():
    hand = hand_mutants(IMPL)
    assert [m.id for m in hand] == [r.id for r in HAND]
    assert all(HAND_ID.fullmatch(m.id) and "@" not in m.id for m in hand)
    scopes = {m.id: m.function for m in hand}
    assert scopes["hand_no_encoder_self_attention_output_dropout"] == "EncoderLayer._sa_block"
    assert scopes["hand_embedding_std_1.4_percent_off"].startswith("Transformer.")


def _committed_keys() -> dict[str, list[str]]:
    """Every mutant key each committed artifact names."""
    table = (ROOT / "docs" / "matrix.md").read_text().split("| clause | test | mutant killed |")[1]
    table = table.split("\n\n")[0]
    return {
        "generated_catalog.json": [m.id for m in generated_catalog.load()],
        "generic_mutants.json": [
            r["key"] for r in json.loads((RESULTS / "generic_mutants.json").read_text())["mutants"]
        ],
        "clause_mutants.json": [
            r["key"] for r in json.loads((RESULTS / "clause_mutants.json").read_text())["mutants"]
        ],
        "clause_mutants.keys": (RESULTS / "clause_mutants.keys").read_text().splitlines(),
        "generic_mutants_triage.json": list(
            json.loads((RESULTS / "generic_mutants_triage.json").read_text())
        ),
        "docs/matrix.md": [
            k for k in re.findall(r"`([^`]+)`", table) if "@" in k or k.startswith("hand_")
        ],
    }


@pytest.mark.parametrize("artifact", list(_committed_keys()))
def test_every_committed_key_names_a_mutant_of_impls_current_text(artifact: str):
    keys = _committed_keys()[artifact]
    known = set(_generated(IMPL)) | {m.id for m in hand_mutants(IMPL)}
    assert keys and len(set(keys)) == len(keys)
    assert [k for k in keys if k not in known] == []
    assert [k for k in keys if LINE_KEY.match(k)] == []


def test_no_committed_file_names_a_mutant_by_line():
    texts = [
        generated_catalog.PATH,
        *(RESULTS / name for name in ("generic_mutants.json", "clause_mutants.json")),
        RESULTS / "clause_mutants.keys",
        RESULTS / "generic_mutants_triage.json",
        RESULTS / "coverage_check.json",
        ROOT / "docs" / "matrix.md",
    ]
    for path in texts:
        found = re.findall(r"\b(?:[a-z]+_)+[a-z0-9.]*@\d+", path.read_text())
        assert found == [], (path.name, found[:3])


def _insert(at: int, text: str) -> str:
    return IMPL[:at] + text + IMPL[at:]


def _span(m: Mutant) -> tuple[int, int]:
    """Where in impl the mutant's change lies: its patch less the text old and new share."""
    (patch,) = m.patches
    at = IMPL.index(patch.old)
    head = len(os.path.commonprefix([patch.old, patch.new]))
    tail = len(os.path.commonprefix([patch.old[head:][::-1], patch.new[head:][::-1]]))
    return at + head, at + len(patch.old) - tail


def _same_names(at: int, added: str, same_patches: bool = True) -> dict[str, Mutant]:
    """The mutants of impl with `added` inserted at `at`: every key of impl's names the same
    change (its mutated text is impl's mutant with the same text inserted) and the same patch
    text, but for a patch whose lines hold the insertion (widened until its text is unique,
    it then holds the added text too), which `same_patches` says there is none of."""
    edited = _insert(at, added)
    before, after = _generated(IMPL), _generated(edited)
    missing = sorted(set(before) - set(after))
    assert missing == [], f"{len(missing)} keys renamed, e.g. {missing[:3]}"
    for key, m in before.items():
        mutated = m.apply(IMPL)
        start, end = _span(m)
        if end <= at:  # the change is above the insertion: the insertion moves by its length
            expected = mutated[: at + len(mutated) - len(IMPL)] + added
            expected += mutated[at + len(mutated) - len(IMPL) :]
        elif start >= at:
            expected = mutated[:at] + added + mutated[at:]
        else:  # the insertion is inside the changed node (a deleted block): replaced with it
            expected = mutated
        assert after[key].apply(edited) == expected, key
        (patch,) = m.patches
        around = IMPL.index(patch.old) < at < IMPL.index(patch.old) + len(patch.old)
        if same_patches or not around:
            assert after[key].patches == m.patches, key
    return after


def test_a_blank_line_a_comment_and_a_new_function_at_the_top_rename_nothing():
    added = "\n# a comment added near the top\n" + ADDED
    after = _same_names(TOP, added)
    new = {k: m for k, m in after.items() if k not in _generated(IMPL)}
    # the new function's own mutants, all in its scope, and nothing else new
    assert new and {m.function for m in new.values()} == {"_added_by_a_test"}
    assert all(_key_prefix(k).split("@")[1].startswith("_added_by_a_test#") for k in new)


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit",
    ["blank line at the top", "comment at the top", "function at the top", "comment in fit"],
)
def test_each_edit_elsewhere_renames_nothing(edit: str):
    text = {
        "blank line at the top": (TOP, "\n"),
        "comment at the top": (TOP, "# a comment line\n"),
        "function at the top": (TOP, ADDED),
        "comment in fit": (IN_FIT, "        # a comment line inside fit\n"),
    }
    at, added = text[edit]
    assert at > 0
    after = _same_names(at, added, same_patches=edit != "comment in fit")
    if edit != "function at the top":
        assert set(after) == set(_generated(IMPL))


def test_a_mutant_added_inside_a_function_renames_only_that_functions_mutants():
    # one more statement at the start of fit: fit's statement deletions after it shift by one,
    # every other function's keys stay
    head = IMPL.index("\n", IMPL.index("\ndef fit(")) + 1
    body = IMPL.index('"""', IMPL.index('"""', head) + 3) + 4  # after fit's docstring
    edited = _insert(body, "    _unused = 1\n")
    before, after = _generated(IMPL), _generated(edited)
    renamed = {k for k in before if k not in after or after[k].patches != before[k].patches}
    assert renamed and {before[k].function for k in renamed} == {"fit"}
