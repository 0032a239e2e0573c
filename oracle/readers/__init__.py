"""Readers of naming schemes: any subject's parameters in the oracle's Params (the contract's
names, torch's stack names, Hugging Face Marian checkpoints)."""
