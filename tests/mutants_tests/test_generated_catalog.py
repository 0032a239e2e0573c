"""The catalog of generated mutants: every record applies exactly once to impl's current text (a
stale one fails loudly, naming its mutant), is what the committed run gives, and the per-run
sample is stratified by clause and the same for the same seed."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from harness.shared_tests.laws import BY_NAME
from harness.subjects import module_source
from mutants import catalog, generated_catalog
from mutants.generated import generate
from mutants.patch import Mutant, PatchError

_, IMPL = module_source("impl.transformer")
RUN = Path(__file__).resolve().parents[2] / "results" / "mutants" / "generic_mutants.json"
MUTANTS = generated_catalog.load()


def test_the_catalog_holds_every_killed_mutant_of_the_run_and_nothing_else():
    run = json.loads(RUN.read_text())["mutants"]
    killed = {r["key"] for r in run if r["status"] != "survived"}
    assert {m.id for m in MUTANTS} == killed and len(MUTANTS) == len(killed) >= 300
    assert not set(catalog.PITFALLS) & {m.id for m in MUTANTS}


def test_every_record_applies_exactly_once_to_impls_current_text():
    assert generated_catalog.stale(IMPL) == {}, "rerun: python -m harness.tools.generic_mutants"
    for m in MUTANTS:
        (patch,) = m.patches
        assert IMPL.count(patch.old) == 1 and m.apply(IMPL) != IMPL


@pytest.mark.parametrize("m", MUTANTS[::7], ids=lambda m: m.id)
def test_a_record_compiles(m: Mutant):
    compile(m.apply(IMPL), m.id, "exec")


def test_a_change_of_impl_under_a_mutant_fails_loudly_naming_it():
    m = MUTANTS[len(MUTANTS) // 2]
    (patch,) = m.patches
    # a comment added at the end of the changed lines: impl's behaviour is the same, its text not
    changed = IMPL.replace(patch.old, patch.old.rstrip("\n") + "  # edited\n")
    assert m.id in generated_catalog.stale(changed)
    with pytest.raises(PatchError, match=rf"mutant {re.escape(m.id)}: patch 1 of 1 .* not found"):
        m.apply(changed)


@pytest.mark.slow
def test_each_record_names_its_killers_operator_and_clause():
    operators = {g.mutator for g in generate(IMPL)}
    for m in MUTANTS:
        assert m.killers and set(m.killers) <= set(BY_NAME), m.id
        assert m.mutator in operators and m.clause in generated_catalog.CLAUSES, m.id
        assert generated_catalog.CLAUSES[m.clause] in m.pitfall
    assert catalog.get(MUTANTS[0].id) is MUTANTS[0]  # a subject's payload finds it by id


@pytest.mark.slow
def test_the_committed_catalog_is_what_the_one_command_gives(tmp_path):
    from harness.tools import generic_mutants

    out = tmp_path / "catalog.json"
    assert generic_mutants.write_catalog(IMPL, RUN, out) == 0
    assert json.loads(out.read_text()) == json.loads(generated_catalog.PATH.read_text()), (
        "rewrite it: python -m harness.tools.generic_mutants --catalog"
    )


def test_the_sample_is_the_same_for_a_seed_and_differs_across_seeds():
    a, b = generated_catalog.draw(12, 7), generated_catalog.draw(12, 7)
    assert a == b and len(a) == 12
    samples = {tuple(m.id for m in generated_catalog.draw(12, seed)) for seed in range(10)}
    assert len(samples) == 10


def test_the_sample_is_stratified_by_clause():
    sizes = Counter(m.clause for m in MUTANTS)
    one_each = generated_catalog.draw(len(sizes), 3)
    assert Counter(m.clause for m in one_each) == dict.fromkeys(sizes, 1)
    # beyond one each, in proportion to the clauses' sizes
    big = Counter(m.clause for m in generated_catalog.draw(100, 3))
    assert sum(big.values()) == 100
    for clause, n in sizes.items():
        assert abs(big[clause] - 1 - (100 - len(sizes)) * n / len(MUTANTS)) <= 1.5, clause
    assert len(generated_catalog.draw(10**6, 0)) == len(MUTANTS)  # never more than there are
    assert generated_catalog.allocation({"a": 3, "b": 1}, 4) == {"a": 3, "b": 1}
