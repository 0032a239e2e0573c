"""The generic-mutant tool: its mutants, its sample, and the committed run's triage."""

from __future__ import annotations

import json

import pytest

from harness.subjects import module_source
from harness.tools import generic_mutants as gm

_, IMPL = module_source(gm.TARGET)


@pytest.fixture(scope="module")
def mutants():
    return gm.generate(IMPL)


@pytest.mark.slow
def test_every_mutant_is_one_compiling_change_of_impl(mutants):
    assert len(mutants) > 500
    assert len({m.id for m in mutants}) == len(mutants)
    assert len({m.apply(IMPL) for m in mutants}) == len(mutants)
    for m in mutants[::25]:
        mutated = m.apply(IMPL)
        (patch,) = m.patches
        original, replacement = m.change()
        assert mutated != IMPL and original in patch.old and replacement in patch.new
        compile(mutated, m.id, "exec")


@pytest.mark.slow
def test_the_operators_include_cosmic_rays_and_the_issues(mutants):
    ops = {m.mutator for m in mutants}
    assert {
        "number_replacer",
        "binary_operator_replacement",
        "comparison_operator_replacement",
        "boolean_replacer",
        "zero_iteration_for_loop",
        "statement_deletion",
        "argument_swap",
        "keyword_argument_removal",
        "api_pair_swap",
    } <= ops
    # the slips the issue names: tril for triu, an eps left out of a LayerNorm
    assert any(m.change() == ("tril", "triu") for m in mutants)
    assert any(
        m.mutator == "keyword_argument_removal"
        and "enc_norm" not in m.change()[0]
        and "eps=cfg.ln_eps" in m.change()[0]
        for m in mutants
    )


@pytest.mark.slow
def test_the_sample_is_seeded_and_stratified(mutants):
    a, b = gm.sample(mutants, 100, 0), gm.sample(mutants, 100, 0)
    assert a == b and abs(len(a) - 100) <= len({m.mutator for m in mutants})
    assert {m.mutator for m in a} == {m.mutator for m in mutants}


def test_a_run_record_names_the_mutant_by_key_and_says_where_it_changes_this_source():
    (hand,) = [m for m in gm.hand_mutants(IMPL) if m.id == "hand_no_embedding_dropout"]
    r = gm.describe(hand, IMPL)
    line = IMPL[: IMPL.index("        return self.dropout(x)\n")].count("\n") + 1
    assert r == {
        "key": "hand_no_embedding_dropout",
        "operator": "hand_no_embedding_dropout",
        "line": line,
        "original": "self.dropout(x)",
        "replacement": "x",
        "function": "Transformer._embed",
    }


@pytest.mark.slow
def test_list_selects_mutants_by_key(capsys):
    key = "number_replacer@TransformerConfig#1:511"
    assert gm.main(["--only", f"{key},hand_logits_in_float32", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{key}\t'512'" and "hand_logits_in_float32\t" in out[1]
    assert gm.main(["--only", "number_replacer@26:20:511", "--list"]) == 2  # an old key: none


def test_the_committed_run_is_triaged_and_scores_at_least_99_percent():
    data = json.loads((gm.RESULTS / "generic_mutants.json").read_text())
    survivors = [m for m in data["mutants"] if m["status"] == "survived"]
    assert all(m.get("triage", {}).get("verdict") in ("equivalent", "gap") for m in survivors)
    assert all(m["triage"]["reason"] for m in survivors)
    assert data["totals"]["untriaged"] == 0 and data["totals"]["score"] >= 0.99


def test_every_clause_row_of_docs_matrix_names_a_mutant_its_test_kills():
    import re

    from harness.jobs.matrix import EXPECTED

    readme = (gm.ROOT / "docs" / "matrix.md").read_text()
    table = readme.split("| clause | test | mutant killed |")[1].split("\n\n")[0]
    matrix = json.loads(EXPECTED.read_text())["outcomes"]
    every = {
        m["key"]: m for m in json.loads((gm.RESULTS / "clause_mutants.json").read_text())["mutants"]
    }
    first = {
        m["key"]: m
        for m in json.loads((gm.RESULTS / "generic_mutants.json").read_text())["mutants"]
    }
    rows = [line.split(" | ") for line in table.strip().splitlines()[1:]]
    assert len(rows) >= 30
    for clause, test, mutants in rows:
        if mutants.strip(" |") == "-":
            continue  # a freedom: nothing to break
        test = test.strip("`")
        ids = re.findall(r"\b([sc]\d\d)\b", re.sub(r"`[^`]*`", "", mutants))
        keys = re.findall(r"`([^`]+)`", mutants)
        assert ids or keys, clause
        for m in ids:
            assert matrix[m][test] == "killed", (clause, m)
        for key in keys:
            if key in every:
                assert test in every[key]["killers"], (clause, key)
            else:
                assert first[key]["killed_by"] == test, (clause, key)
