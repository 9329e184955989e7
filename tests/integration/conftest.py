"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from danaus.mesh import set_unhandled_fault_hook

from ..faults import Failures
from .console_kit import Console


@pytest.fixture
def failures() -> Iterator[Failures]:
    """The controller's fault hook, recording the failures it gets during the test."""
    got = Failures()
    old = set_unhandled_fault_hook(got)
    yield got
    set_unhandled_fault_hook(old)


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    """The controller's console as the forwarding sees it (pytest swaps sys.stdout itself
    around each test phase, so the forwarding module's view of ``sys`` is replaced)."""
    import types

    import danaus.mesh._procs.logs as logs

    c = Console()
    monkeypatch.setattr(logs, "sys", types.SimpleNamespace(stdout=c, stderr=c))
    return c
