"""Commands for the staff, not the students: the smoke check and the benchmark of the oracle, and
the derivations of the stored bars and tolerances (learning_bar, calibrate)."""
