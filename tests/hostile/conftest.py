"""The hostile submissions and suites are data for tests/test_hostile.py, never tests themselves."""

collect_ignore_glob = ["hostile_*.py", "attack_*.py", "suites"]
