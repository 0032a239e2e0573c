"""Data for tests/harness_tests/isolation/test_hostile.py: hostile submissions and suites,
never tests."""

collect_ignore_glob = ["hostile_*.py", "attack_*.py", "suites"]
