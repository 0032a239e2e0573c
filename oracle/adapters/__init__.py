"""The oracle's equations arranged as other designs' blocks: seed 002's Flax pre-LN decoder block
and seed 004's shared-weight stacks (their forwards and backwards, from the same ops)."""
