"""A failed proc started again in its place (``mesh.seam.respawn_procs``): the proc mesh
its user holds is whole again, rank for rank, on this host and through a host agent."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from danaus import Actor, SupervisionError, current_rank, endpoint, this_host
from danaus.mesh.seam import group_of, respawn_procs

from .. import faults
from ..faults import Failures
from .actors_lib import Echo


class _Env(Actor):
    @endpoint
    def get(self, name: str) -> str | None:
        return os.environ.get(name)


def _mark() -> None:
    os.environ["BOOTED_RANK"] = str(current_rank().rank)


async def _killed(procs: Any, rank: int) -> int:
    pid = faults.kill(procs, rank)
    async with asyncio.timeout(10):
        await group_of(procs).wait_failed()
    return pid


async def test_a_killed_proc_is_started_again_in_place_and_the_mesh_is_whole(
    failures: Failures,
) -> None:
    async with this_host().spawn_procs(
        per_host={"procs": 3}, bootstrap=_mark, env={"DANAUS_TEST_ENV": "kept"}
    ) as procs:
        echo = await procs.spawn("echo", Echo)
        before = list(procs.pids)
        dead = await _killed(procs, 1)
        await respawn_procs(procs, [1])
        after = procs.pids
        assert after[0] == before[0] and after[2] == before[2]
        assert after[1] not in (before[1], dead, -1)
        assert group_of(procs).failed_procs() == {}
        # the actors spawned before stay failed at rank 1; the others serve on
        with pytest.raises(SupervisionError, match=r"rank \{'procs': 1/3\} failed: .*SIGKILL"):
            await echo.slice(procs=1).echo.call_one(1)
        assert (await echo.slice(procs=slice(0, 3, 2)).echo.call(2)).values() == [2, 2]
        # a mesh spawned now has an actor in the new proc, started as the first was
        again = await procs.spawn("again", Echo)
        assert (await again.pid.call()).values() == after
        env = await procs.spawn("env", _Env)
        assert (await env.get.call("DANAUS_TEST_ENV")).values() == ["kept"] * 3
        assert (await env.get.call("BOOTED_RANK")).values() == ["0", "1", "2"]
        # and its failures are seen as the first's were
        await _killed(procs, 1)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            await again.slice(procs=1).echo.call_one(1)


async def test_only_a_failed_proc_of_a_running_mesh_is_started_again() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    await procs.initialized
    with pytest.raises(ValueError, match=r"rank\(s\) \[0\] .* not failed procs"):
        await respawn_procs(procs, [0])
    with pytest.raises(ValueError, match=r"rank\(s\) \[5\]"):
        await respawn_procs(procs, [5])
    await procs.stop()
    with pytest.raises(SupervisionError, match="was stopped"):
        await respawn_procs(procs, [1])


async def test_a_host_agents_proc_is_started_again_by_its_agent(failures: Failures) -> None:
    from danaus import attach_to_hosts

    from .agents_kit import controller_key, host_agents

    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=os.getcwd())
    with host_agents([f"tcp://127.0.0.{i}:0" for i in (2, 3)], [env, env]) as agents:
        with controller_key(key):
            hosts = attach_to_hosts([addr for addr, _ in agents])
            async with hosts.spawn_procs(per_host={"procs": 2}) as procs:
                echo = await procs.spawn("echo", Echo)
                pids = (await echo.pid.call()).values()
                os.kill(pids[3], signal.SIGKILL)  # (the agents' procs run on this machine)
                async with asyncio.timeout(15):
                    await group_of(procs).wait_failed()
                await respawn_procs(procs, [3])
                assert group_of(procs).agent_of(3) == agents[1][0]
                again = await procs.spawn("again", Echo)
                now = (await again.pid.call()).values()
                assert now[:3] == pids[:3] and now[3] != pids[3]
                assert (await again.echo.call(7)).values() == [7] * 4
                with pytest.raises(SupervisionError):
                    await echo.slice(hosts=1, procs=1).echo.call_one(1)
