"""The catalog of generated mutants that are faults for sure, and the per-run sample of them.

mutants/generated_catalog.json holds the generated mutants of impl (mutants.generated) that the
shared laws killed in the committed run (results/mutants/generic_mutants.json): equivalent and
unkilled ones are left out, so every mutant scored is a real fault. Each is a record of the
catalog's type (mutants.patch.Mutant: one exact-text patch that must apply exactly once), keyed
as the generator keys it (by scope and ordinal, never by line: adding lines elsewhere in impl
renames nothing), with its operator (`mutator`), the def it changes (`function`), the law(s)
that killed it (`killers`: the first in the registry's order, as the committed run stops there)
and the contract clause it breaks (`clause`, one of CLAUSES). The records' order is the draws'
order: a rebuild keeps it.

The clause comes from the README's clause table: the killing law owns one clause or a few, and
where it owns several, the function of impl the change lies in tells which (RULES, first match).

`python -m harness.tools.generic_mutants --catalog` rewrites the JSON from the committed run;
tests/mutants_tests/test_generated_catalog.py checks every record against impl's current text.
`draw(n, seed)` is a mutation-score run's secret sample: stratified by clause.
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any

from mutants.generated import TARGET
from mutants.patch import Mutant, Patch, PatchError

PATH = Path(__file__).with_name("generated_catalog.json")

# clause -> what a student reads: the README's clause table, by the laws that own its rows
CLAUSES = {
    "defaults": "TransformerConfig's fields and the functions' defaults",
    "config": "TransformerConfig: its fields, and ValueError for an invalid norm or d_model",
    "input_checks": "inputs checked: masks bool and shaped like their ids, batch sizes, max_len",
    "forward": "encode / decode / forward values: attention, feed-forward, residuals, "
    "LayerNorm (ln_eps), the layer stacks, logits",
    "embeddings": "embeddings: x0 = E[ids] sqrt(d_model) + PE, the tables' init, tying",
    "masking": "masks: the causal mask, source padding never read, cross-attention reads "
    "the encoder",
    "parameters": "state_dict names and shapes",
    "dropout": "dropout at every site, in training mode only",
    "loss": "label_smoothed_loss: the smoothed target, the mean over non-pad targets",
    "noam": "noam_rate: n = step + 1, warmup and factor",
    "optimizer": "make_optimizer: Adam, betas (0.9, 0.98), eps 1e-9, no weight decay",
    "fit": "fit: steps, schedule, seed, training mode, teacher forcing, its checks",
    "decode_step": "decode_step and init_state: row t of decode, a KV cache, the state kept",
    "translate": "translate: greedy at beam 1, no bos or eos, Python ints, mode restored",
    "save_load": "save_transformer / load_transformer: the files, a tied tensor once",
    "beam_search": "the pinned beam search: its scores, length penalty and stop rule",
}

_CONFIG = ("TransformerConfig", "__post_init__", "of")
_CHECKS = (
    "_check_source",
    "_check_target",
    "_check_memory",
    "_check_mask",
    "_check_ids_and_mask",
    "_check_rows_have_tokens",
    "_check_batches",
)
# (clause, killing laws, functions of impl or None for any): the first rule that matches the
# first killer and the function the change lies in names the clause
RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None], ...] = (
    ("defaults", ("test_defaults_are_the_contracts",), None),
    ("config", ("test_golden_torch", "test_validation"), _CONFIG),
    ("fit", ("test_validation",), ("fit",)),
    ("input_checks", ("test_validation",), None),
    ("input_checks", ("test_golden_torch",), _CHECKS),
    (
        "embeddings",
        ("test_golden_torch",),
        ("positional_encoding", "_embed", "tgt_table", "out_weight"),
    ),
    ("loss", ("test_golden_torch", "test_hand_example_label_smoothing"), ("label_smoothed_loss",)),
    ("forward", ("test_golden_torch",), None),
    ("embeddings", ("test_embeddings_scaled_and_tied",), None),
    (
        "masking",
        ("test_decoder_is_causal", "test_source_padding_is_never_read"),
        None,
    ),
    ("masking", ("test_decoder_reads_the_source",), None),
    ("parameters", ("test_parameter_names_follow_the_norm",), None),
    ("dropout", ("test_dropout_at_every_site", "test_dropout_only_in_training"), None),
    ("loss", ("test_hand_example_label_smoothing",), None),
    ("noam", ("test_hand_example_noam",), None),
    ("optimizer", ("test_optimizer_is_the_papers_adam",), None),
    ("fit", ("test_fit_follows_the_schedule_and_is_reproducible",), None),
    ("fit", ("test_learns_reversed_addition",), None),
    ("decode_step", ("test_decode_step_equals_forward", "test_decode_step_reads_a_kv_cache"), None),
    (
        "save_load",
        ("test_translate_is_greedy_with_beam_one_and_drops_eos",),
        ("save_transformer", "load_transformer"),
    ),
    ("translate", ("test_translate_is_greedy_with_beam_one_and_drops_eos",), None),
    ("beam_search", ("test_beam_search_matches_oracle",), None),
)


def clause_of(killer: str, function: str) -> str:
    """The clause a mutant killed first by `killer`, changing `function` of impl, breaks."""
    for clause, laws, functions in RULES:
        if killer in laws and (functions is None or function in functions):
            return clause
    where = function or "module level"
    raise ValueError(
        f"no clause rule for a mutant of {where} killed by {killer!r}: add one to RULES"
    )


def build(
    mutants: list[Mutant], run: dict[str, Any], order: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The catalog's JSON from impl's current generated mutants and a committed generic-mutant
    run: every mutant the run killed, by id; an id the generator no longer gives raises (impl
    changed under it: rerun the tool on those ids first). The records keep `order` (the
    committed catalog's ids: a seed's draw depends on the order, so a rebuild must not move
    it), then come the rest in source order."""
    by_id = {m.id: m for m in mutants}
    killed = [r for r in run["mutants"] if r["status"] != "survived"]
    gone = [r["key"] for r in killed if r["key"] not in by_id]
    if gone:
        raise ValueError(
            f"{len(gone)} killed mutants of the run are no longer generated from impl's current "
            f"source (impl changed): {gone[:5]}; rerun them with --only and rebuild"
        )
    records: list[dict[str, Any]] = []
    for r in killed:
        m = by_id[r["key"]]
        killers = sorted(r.get("killers") or [r["killed_by"]])
        (patch,) = m.patches
        records.append(
            {
                "id": m.id,
                "operator": m.mutator,
                "clause": clause_of(r["killed_by"], m.function.rpartition(".")[2]),
                "killers": killers,
                "function": m.function,
                "old": patch.old,
                "new": patch.new,
            }
        )
    rank = {key: i for i, key in enumerate(order)}
    rank.update({m.id: len(order) + i for i, m in enumerate(mutants) if m.id not in rank})
    records.sort(key=lambda r: rank[r["id"]])
    return {
        "about": "generated mutants of impl that the shared laws kill; written by "
        "`python -m harness.tools.generic_mutants --catalog` (mutants.generated_catalog)",
        "from_run": run.get("command", ""),
        "run_date": run.get("date", ""),
        "clauses": CLAUSES,
        "mutants": records,
    }


def record(data: dict[str, Any]) -> Mutant:
    """One catalog entry as a Mutant."""
    return Mutant(
        id=data["id"],
        mutator=data["operator"],
        pitfall=f"{data['operator']} in {data['function']}: breaks {CLAUSES[data['clause']]}",
        killers=tuple(data["killers"]),
        patches=(Patch(data["old"], data["new"]),),
        target=TARGET,
        clause=data["clause"],
        function=data["function"],
    )


@cache
def load(path: Path = PATH) -> tuple[Mutant, ...]:
    """Every mutant of the committed catalog, in its order."""
    if path == PATH and not path.exists():  # the student kit: the catalog's text is sealed
        from harness import sealed

        data = json.loads(sealed.sealed_texts()["mutants/generated_catalog.json"])
    else:
        data = json.loads(path.read_text())
    return tuple(record(m) for m in data["mutants"])


@cache
def by_id() -> dict[str, Mutant]:
    return {m.id: m for m in load()}


def stale(source: str, mutants: tuple[Mutant, ...] | None = None) -> dict[str, str]:
    """The records whose patch no longer applies exactly once to `source` (impl changed under
    them), each with the PatchError that names it."""
    found = {}
    for m in load() if mutants is None else mutants:
        try:
            m.apply(source)
        except PatchError as e:
            found[m.id] = str(e)
    return found


def allocation(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many of n to draw from each clause: one from each while n allows (the clauses with
    the most mutants first), the rest in proportion to their sizes (largest remainders), never
    more than a clause holds."""
    n = min(n, sum(sizes.values()))
    order = sorted(sizes, key=lambda c: (-sizes[c], c))
    take = {c: 0 for c in sizes}
    for c in order[:n]:
        take[c] = 1
    left = n - sum(take.values())
    while left > 0:
        total = sum(sizes.values())
        want = {c: left * sizes[c] / total for c in order if take[c] < sizes[c]}
        floors = {c: min(int(w), sizes[c] - take[c]) for c, w in want.items()}
        rest = sorted(want, key=lambda c: (-(want[c] - int(want[c])), order.index(c)))
        for c in rest[: left - sum(floors.values())]:
            floors[c] += 1
        for c, k in floors.items():
            take[c] += min(k, sizes[c] - take[c])
        moved = n - sum(take.values())
        if moved == left:  # nothing more fits anywhere (cannot happen while n <= the total)
            break
        left = moved
    return take


def draw(n: int, seed: int, mutants: tuple[Mutant, ...] | None = None) -> list[Mutant]:
    """A seeded sample of n generated mutants, stratified by clause (`allocation`), in the
    catalog's order: the same seed gives the same sample."""
    pool = load() if mutants is None else mutants
    groups: dict[str, list[Mutant]] = {}
    for m in pool:
        groups.setdefault(m.clause, []).append(m)
    rng = random.Random(seed)
    take = allocation({c: len(g) for c, g in groups.items()}, n)
    chosen = {m.id for c in sorted(groups) for m in rng.sample(groups[c], take[c])}
    return [m for m in pool if m.id in chosen]
