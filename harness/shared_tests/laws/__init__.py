"""The shared property tests, by family: each a check with its `@law` record above it, in the
family's module (hand_examples, values, masking, decoding, interface, optimizer, training,
dropout), its worker half in the same-named module of harness.isolation.child.probes.

Every check runs in the trusted parent: it chooses inputs, asks the subject's worker to run
probes on them, and judges the plain data that comes back against the oracle or against the law
itself. A failure says what differed, by how much, and where.

ORDER is the matrix's columns and a grade's lines: the seed's fourteen first, in the seed's
order, then the laws added since. A law registered but not listed here (or listed but not
registered) stops the import.
"""

from __future__ import annotations

from harness.shared_tests.laws import (  # noqa: F401  (each module registers its laws)
    decoding,
    dropout,
    hand_examples,
    interface,
    masking,
    optimizer,
    training,
    values,
)
from harness.shared_tests.record import REGISTRY, Test

ORDER = (
    "test_hand_example_label_smoothing",
    "test_hand_example_noam",
    "test_golden_torch",
    "test_decoder_is_causal",
    "test_source_padding_is_never_read",
    "test_decoder_reads_the_source",
    "test_decode_step_equals_forward",
    "test_embeddings_scaled_and_tied",
    "test_parameter_names_follow_the_norm",
    "test_optimizer_is_the_papers_adam",
    "test_fit_follows_the_schedule_and_is_reproducible",
    "test_translate_is_greedy_with_beam_one_and_drops_eos",
    "test_beam_search_matches_oracle",
    "test_validation",
    "test_defaults_are_the_contracts",
    "test_dropout_only_in_training",
    "test_learns_reversed_addition",
    "test_dropout_at_every_site",
    "test_decode_step_reads_a_kv_cache",
)


def _ordered() -> tuple[Test, ...]:
    by_name = {t.name: t for t in REGISTRY}
    if set(by_name) != set(ORDER) or len(ORDER) != len(set(ORDER)):
        unlisted, unregistered = set(by_name) - set(ORDER), set(ORDER) - set(by_name)
        raise ImportError(
            f"the laws registered and ORDER differ: not in ORDER {sorted(unlisted)}, "
            f"in ORDER but not registered {sorted(unregistered)}"
        )
    return tuple(by_name[name] for name in ORDER)


SHARED_TESTS: tuple[Test, ...] = _ordered()
BY_NAME = {t.name: t for t in SHARED_TESTS}
