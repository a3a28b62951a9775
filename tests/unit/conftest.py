"""Fixtures of the unit tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Threads take turns about every microsecond (instead of 5 ms): a race shows in a short
    run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
