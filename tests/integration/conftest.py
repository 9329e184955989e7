"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from .console_kit import Console


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    """The controller's console as the forwarding sees it (pytest swaps sys.stdout itself
    around each test phase, so the forwarding module's view of ``sys`` is replaced)."""
    import types

    import danaus.mesh._logs as logs

    c = Console()
    monkeypatch.setattr(logs, "sys", types.SimpleNamespace(stdout=c, stderr=c))
    return c
