"""The shared property tests (the seed's section 4, plus beam search, dropout and learning).

record.py says what a test is (one `@law` record on its check); laws.py holds the checks, their
inputs and verdict helpers; diagnosis.py says where a wrong forward pass first goes wrong. The
probes that run in the subject's worker are the child's (harness.isolation.child.probes).
"""
