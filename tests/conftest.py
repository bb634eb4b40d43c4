"""Fixtures shared across the test folders."""

from realkube_kit import pytest_runtest_makereport, real_kube_session

__all__ = ["pytest_runtest_makereport", "real_kube_session"]
