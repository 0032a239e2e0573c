"""`xfmr generated-draws`: each draw's sample as a mutation-score run draws it, counted off the
union's outcomes (the measurement itself is results/mutants/generated_draws.md)."""

from harness.jobs import mutation_score as ms
from harness.shared_tests.inputs import draw_secret, set_draw_secret
from harness.tools.generated_draws import markdown, samples


def test_each_draw_gets_the_sample_its_mutation_score_run_draws():
    before = draw_secret()
    got = samples([0, 1, 0], 12)
    assert draw_secret() == before  # the run's own secret is left as it was
    set_draw_secret(1)
    try:
        assert got[1] == [s.mutant for s in ms.generated_subjects(12)]
    finally:
        set_draw_secret(before)
    assert len(got[0]) == len(set(got[0])) == 12 and got[0] != got[1]


def test_each_draw_is_counted_on_its_own_sample():
    by_draw = {0: ["a", "b", "c"], 1: ["c", "d", "e"]}
    killed = {
        "x/strong": {"a": True, "b": True, "c": True, "d": False, "e": True},
        "x/weak": {"a": False, "b": True, "c": False, "d": False, "e": False},
    }
    text = markdown(by_draw, killed, {"x/strong": 60.0, "x/weak": 30.0}, "xfmr generated-draws")
    assert "| 0 | 3 of 3 | 1 of 3 |" in text
    assert "| 1 | 2 of 3 | 0 of 3 |" in text
    assert "| strong | 4 of 5 | 1.0 |" in text and "| weak | 1 of 5 | 0.5 |" in text
