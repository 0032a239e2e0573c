"""The shared property tests (the seed's section 4, plus beam search, dropout and learning).

record.py says what a test is (one `@law` record on its check); laws/ holds the checks, one
module per family; inputs.py draws what they judge with (weights, batches, the learning task's
instance) and verdicts.py reads and compares the answers; layout.py puts a hooked value in the
contract's batch-first layout. diagnosis.py says where a wrong forward pass first goes wrong, with
diagnosis_answer.py (an answer read beside the contract's values) and diagnosis_faults.py (the
classic faults it can name). The probes that run in the subject's worker are the child's
(harness.isolation.child.probes).
"""
