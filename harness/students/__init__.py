"""The students' commands, on their own code and their own machine (no sandbox, never a grade):
`xfmr start` (start.py: a starting folder generated from the contract), `xfmr check`
(selfcheck.py: the shared tests, or with --suite the mutation score of their tests),
`pytest --xfmr` (pytest_plugin.py, the pytest11 entry point), `xfmr diff` (diff.py: the
reference beside their code after a full pass) and `xfmr milestone --submission` (milestone.py:
a thin entry to demos.own_model, MS-L5 on their own model). Front ends over the grading and the
jobs: nothing below imports them."""
