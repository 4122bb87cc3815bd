"""Fixtures for the security checks: the controller tests' tiny random-init target and its
greedy traffic (one definition, in tests/controller/conftest.py)."""

from tests.controller.conftest import tiny, traffic  # noqa: F401  (pytest fixtures)
