"""The trust boundary, from the parent's side: how untrusted code is started, confined, spoken to
and ended. What runs inside a worker lives in harness.isolation.child, which imports nothing of
this package's parent-side modules (and nothing of the judge: oracle, impl, mutants, the tests).

This file stays empty of imports: the child package is staged into the sandbox with it.
"""
