"""Fixtures of the ibverbs tests: ``procs``, an owner and a reader backend on one FAKE
fabric (ibverbs_kit.py), closed after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .ibverbs_kit import Procs, _procs


@pytest.fixture
async def procs() -> AsyncIterator[Procs]:
    p = _procs()
    yield p
    await p.reader.aclose()
    for owner in p.owners.values():
        await owner.aclose()
