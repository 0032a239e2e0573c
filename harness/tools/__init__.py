"""Commands for the staff, not the students: the smoke check and the benchmark of the oracle, and
the derivation of the stored learning bar (learning_bar)."""
