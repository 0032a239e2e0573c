"""The mutant catalog: every patch applies exactly once to impl's source, and a stale one fails
loudly, naming its mutant."""

from __future__ import annotations

import pytest

from harness.isolation.child.load import subject as load
from harness.shared_tests.laws import BY_NAME
from harness.subjects import Kind, Subject, module_source
from mutants import catalog
from mutants.patch import Mutant, Patch, PatchError

_, IMPL = module_source("impl.transformer")


@pytest.mark.parametrize("mutant", catalog.MUTANTS, ids=lambda m: m.id)
def test_every_patch_applies_exactly_once_and_compiles(mutant: Mutant):
    for patch in mutant.patches:
        assert IMPL.count(patch.old) == 1, f"{mutant.id}: {patch.old!r}"
    mutated = mutant.apply(IMPL)
    assert mutated != IMPL
    compile(mutated, f"<{mutant.id}>", "exec")


@pytest.mark.parametrize("mutant", catalog.MUTANTS, ids=lambda m: m.id)
def test_every_mutant_names_real_killers_and_a_location(mutant: Mutant):
    assert set(mutant.killers) <= set(BY_NAME), mutant.killers
    assert mutant.pitfall and mutant.mutator
    for (line, col), (end_line, end_col) in mutant.locations(IMPL):
        assert 1 <= line <= end_line and col >= 1 and end_col >= 1
    diff = mutant.diff(IMPL)
    assert diff.startswith("--- a/impl/transformer.py") and "\n+" in diff


def test_the_catalog_is_the_seeds_pitfall_table():
    assert catalog.PITFALLS == tuple(f"s{i:02d}" for i in range(1, 12))
    # section 5: each pitfall's test, as the seed names it
    assert catalog.get("s01").killers == ("test_golden_torch",)
    assert catalog.get("s10").killers == ("test_decode_step_equals_forward",)
    with pytest.raises(KeyError, match="s99"):
        catalog.get("s99")


def test_the_contract_clause_mutants_are_not_the_seeds_rung():
    # issue 12's laws: in the matrix, not required of a student's suite, not in mutation-score
    assert catalog.CLAUSES == ("c01", "c02", "c03", "c04")
    assert not any(catalog.get(m).required for m in catalog.CLAUSES)
    assert not set(catalog.CLAUSES) & set(catalog.PITFALLS)
    from harness.jobs.matrix import matrix_subjects

    assert [s.name for s in matrix_subjects()][-4:] == list(catalog.CLAUSES)


def test_a_stale_patch_fails_loudly_naming_the_mutant():
    stale = Mutant("s42", "Stale", "impl changed under it", (), (Patch("no such text", "x"),))
    with pytest.raises(PatchError, match=r"mutant s42: patch 1 of 1 .* not found"):
        stale.apply(IMPL)
    ambiguous = Mutant("s43", "Ambiguous", "text found twice", (), (Patch("nn.Module", "x"),))
    with pytest.raises(PatchError, match=r"mutant s43: .* found \d+ times"):
        ambiguous.apply(IMPL)


def test_a_mutant_reaches_its_worker_as_patched_source():
    payload = Subject("s11", Kind.MUTANT, module="impl.transformer", mutant="s11").payload()
    assert payload["source"] == catalog.get("s11").apply(module_source("impl.transformer")[1])
    module = load(payload)
    assert "mutant s11" in module.__file__
    from impl import transformer

    assert module.Transformer is not transformer.Transformer


def test_the_sanity_mutant_makes_every_contract_function_raise():
    module = load(
        Subject("sanity", Kind.SANITY, module="impl.transformer", mutant="sanity").payload()
    )
    cfg = module.TransformerConfig(src_vocab=5, tgt_vocab=5, d_model=8, n_heads=2, d_ff=8)
    for call in (
        lambda: module.Transformer(cfg),
        lambda: module.noam_rate(0, 16, 4),
        lambda: module.label_smoothed_loss(None, None, 0.1, 0),
        lambda: module.load_transformer("."),
    ):
        with pytest.raises(RuntimeError, match="sanity mutant"):
            call()


def test_show_patches_prints_every_mutant_as_a_diff_of_impl():
    from harness.jobs.matrix import show_patches

    shown = show_patches()
    for mutant in catalog.MUTANTS:
        assert f"# {mutant.id} ({mutant.mutator}): {mutant.pitfall}" in shown
        assert f"+++ b/impl/transformer.py ({mutant.id})" in shown


def test_a_hand_mutant_is_a_record_whose_patch_names_it_when_gone():
    from mutants.generated import HAND, hand_mutants

    assert [m.id for m in hand_mutants(IMPL)] == [r.id for r in HAND]
    gone = IMPL.replace(HAND[0].patches[0].old, "")
    with pytest.raises(PatchError, match=rf"mutant {HAND[0].id}: patch 1 of 1 .* not found"):
        hand_mutants(gone)
