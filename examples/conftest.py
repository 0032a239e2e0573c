"""The example student suites are material for `xfmr mutation-score`, not the project's tests:
they import `tinyllm.xfmr.transformer`, which only the grader's workers provide."""

collect_ignore = ["student_tests_strong", "student_tests_weak", "student_tests_pitfalls"]
