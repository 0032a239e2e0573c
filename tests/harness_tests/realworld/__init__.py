"""Real-world-style submissions and their single-fault variants (see run_set.py)."""
