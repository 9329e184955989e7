"""Tests of danaus.mesh._actor_spawn against a hand-made peer: a spawn still unanswered
when its runtime closes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danaus import Actor, ClosedError
from danaus.actors._loops import current_runtime
from danaus.actors._runtime import Runtime
from danaus.actors._wire import Spawn
from danaus.mesh import ProcMesh, Shape
from danaus.mesh._proc_group import GroupRef, ProcGroup


async def test_a_spawn_unanswered_when_its_runtime_closes_fails_initialized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = Runtime(asyncio.get_running_loop())  # a proc that never answers a Spawn
    spawned = asyncio.Event()

    def swallow(conn: Any, msg: Any, parts: Any) -> None:
        if isinstance(msg, Spawn):
            spawned.set()

    monkeypatch.setattr(silent, "dispatch", swallow)
    try:
        ref = GroupRef("silent", Shape.from_sizes({"procs": 1}), (silent.addr,), {}, None)
        group = ProcGroup.from_reference(ref)
        mesh = ProcMesh(group.shape, group).spawn_mesh("a", Actor)
        async with asyncio.timeout(30):
            await spawned.wait()
        # Closing gives the open reply port rank -1: the spawn fails, nothing raises here.
        await current_runtime().aclose()
        with pytest.raises(ClosedError, match="closed"):
            mesh.init_done.result(timeout=0)
    finally:
        await silent.aclose()
