"""Deadlines of tests, scaled for slow machines.

``DANAUS_TEST_TIME_SCALE`` (default 1) multiplies every wait a test bounds with
:func:`within`: ``make test-rdma`` sets it, since under CPU emulation everything runs
10-50x slower. A deadline a test expects to pass is a bound, never a speed target (speed
is measured by ``make bench``), so scaling it changes no verdict on a correct program.
"""

from __future__ import annotations

import os

__all__ = ["SCALE", "within"]

SCALE = float(os.environ.get("DANAUS_TEST_TIME_SCALE") or 1)


def within(seconds: float) -> float:
    """``seconds``, scaled by ``DANAUS_TEST_TIME_SCALE``."""
    return seconds * SCALE
