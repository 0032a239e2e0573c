"""The hostile submissions are data for tests/test_grade_hostile.py, never tests themselves."""

collect_ignore_glob = ["hostile_*.py"]
