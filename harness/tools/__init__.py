"""The course's measurements, for the staff: each one's results go under results/ (bench,
bench-engine, bound-check, detection, false-alarms, generated-draws, the generic mutants, coverage
inference, the Stryker screenshot) or into harness/data/ (learning_bar, the learning test's bar)."""
