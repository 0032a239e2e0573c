"""The oracle put to use on a model, neither a grade nor a measurement kept under results/:
`xfmr compare` (compare.py: anyone's outputs, any dtype, against the oracle within the derived
bound; nothing of theirs runs) and `xfmr smoke` (smoke.py: impl against the oracle, a fresh
install's ten-second health check)."""
