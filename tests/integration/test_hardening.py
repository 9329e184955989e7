"""Slow or busy peers are slow, not dead: backpressure and busy loops never cost a proc
its life or a message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from danaus import config, this_host

from .values_actors import Slow

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def strict_liveness(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A peer silent for 1 s is lost; a mailbox holds 20 messages before backpressure."""
    for name, value in (("heartbeat_interval", 0.2), ("heartbeat_timeout", 1.0),
                        ("mailbox_limit", 20)):
        monkeypatch.setenv(f"DANAUS_{name.upper()}", str(value))
        monkeypatch.setattr(config, name, value)
    yield


@pytest.mark.parametrize("endpoint_name", ["work", "awork"])
async def test_backpressure_does_not_kill_a_healthy_proc(
        strict_liveness: None, endpoint_name: str) -> None:
    n = 250  # 2.5 s of work: the receiver holds its connection most of that time
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        slow = await procs.spawn("slow", Slow)
        endpoint = getattr(slow, endpoint_name)
        for _ in range(n):
            await asyncio.wait_for(endpoint.post(0.01), 30)
        assert await asyncio.wait_for(slow.count.call_one(), 30) == n
