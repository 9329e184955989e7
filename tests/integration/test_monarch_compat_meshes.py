"""Monarch names with Monarch's semantics for proc and host meshes: the bootstrap, default
names, shutdown, hosts from config, the logging option, and the procs an actor spawns on.
Actors and endpoints: test_monarch_compat.py."""

from __future__ import annotations

import asyncio
import os

import pytest

import danaus
from danaus import this_host


async def test_spawn_procs_bootstrap_sets_per_coordinate_environment_first() -> None:
    from danaus import ActorError

    from .compat_actors import Env, async_setup, failing_setup, gpu_setup

    procs = this_host().spawn_procs({"hosts": 1, "gpus": 3}, gpu_setup, "trainers")
    async with procs:
        env = procs.spawn("env", Env)  # not awaited: still runs after the bootstrap
        assert (await env.seen_at_init.call()).values() == ["0", "1", "2"]
        await procs.initialized
    async with this_host().spawn_procs(per_host={"procs": 2}, bootstrap=async_setup) as procs:
        env = await procs.spawn("env", Env)
        assert (await env.get.call("SETUP_RANK")).values() == ["0", "1"]
    async with this_host().spawn_procs(per_host={"procs": 2}, bootstrap=failing_setup) as procs:
        with pytest.raises(ActorError, match="setup failed at"):
            await procs.initialized
    with pytest.raises(TypeError, match="bootstrap must be a function"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap="setup.sh")  # type: ignore[arg-type]


async def test_default_mesh_names_are_distinct_and_to_table() -> None:
    first = this_host().spawn_procs(per_host={"procs": 2})
    second = this_host().spawn_procs(per_host={"procs": 1})
    try:
        assert first.name != second.name
        assert first.name.startswith("procs") and second.name.startswith("procs")
        await first.initialized
        table = first.to_table().splitlines()
        assert table[0].split() == ["rank", "procs", "pid", "address"]
        assert [line.split()[:3] for line in table[1:]] == [
            ["0", "0", str(first.pids[0])],
            ["1", "1", str(first.pids[1])],
        ]
    finally:
        await first.stop()
        await second.stop()
    third = this_host().spawn_procs(per_host={"procs": 1})  # a stopped mesh's name is free
    async with third:
        assert third.name in (first.name, second.name)


async def test_host_mesh_shutdown_stops_its_proc_meshes() -> None:
    from danaus import SupervisionError

    from .compat_actors import Env

    host = this_host()
    procs = host.spawn_procs(per_host={"procs": 2})
    env = await procs.spawn("env", Env)
    pids = procs.pids
    await host.shutdown()
    with pytest.raises(SupervisionError):
        await env.get.call("HOME")
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: gone


async def test_hosts_from_config_without_a_config_is_two_local_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .compat_actors import Ranks

    monkeypatch.delenv("MONARCH_HOSTS", raising=False)
    hosts = danaus.hosts_from_config("MONARCH_HOSTS")
    assert hosts.extent == danaus.Extent(["hosts"], [2])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    async with procs:
        assert procs.extent.labels == ["hosts", "gpus"] and procs.extent.sizes == [2, 2]
        ranks = await procs.spawn("ranks", Ranks)
        who = await ranks.slice(hosts=1).who.call()
        assert [w["message"] for w in who.values()] == [{"gpus": 0}, {"gpus": 1}]
        await hosts.shutdown()


async def test_logging_option_is_awaitable_and_aggregates_identical_lines(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from .compat_actors import Env

    async with this_host().spawn_procs(per_host={"procs": 4}, name="agg") as procs:
        env = await procs.spawn("env", Env)
        await procs.logging_option(stream_to_client=True, aggregate_window_sec=0.5)
        await env.say.call("the same line from every rank")
        await env.slice(procs=2).say.call_one("only rank 2")
        await procs.logging_option(aggregate_window_sec=None)  # flushes what is pending
        await env.slice(procs=1).say.call_one("one by one")
    out = capfd.readouterr().out
    assert out.count("the same line from every rank") == 1
    assert "[agg 0-3] the same line from every rank" in out
    assert "[agg 2] only rank 2" in out
    assert "[agg 1] one by one" in out
    with pytest.raises(ValueError, match="aggregate_window_sec"):
        procs.logging_option(aggregate_window_sec=-1)


async def test_actor_instance_proc_spawns_next_to_the_actor() -> None:
    from .compat_actors import Spawner

    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        spawners = await procs.spawn("spawners", Spawner)
        pairs = (await spawners.sibling_pid.call()).values()
        assert [a for a, _ in pairs] == procs.pids
        assert all(a == b for a, b in pairs)


async def test_shutdown_context_stops_every_proc_mesh_of_this_process() -> None:
    first = this_host().spawn_procs(per_host={"procs": 2})
    second = this_host().spawn_procs(per_host={"procs": 1})
    await first.initialized
    await second.initialized
    pids = first.pids + second.pids
    await danaus.shutdown_context()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    await danaus.shutdown_context()  # nothing left: done at once


async def test_actor_instance_proc_mesh_spawns_on_every_proc_of_the_actors_mesh() -> None:
    from .compat_actors import MeshSpawner

    async with this_host().spawn_procs(per_host={"procs": 3}, name="pm") as procs:
        spawner = await procs.slice(procs=1).spawn("spawner", MeshSpawner)
        got = await asyncio.wait_for(spawner.siblings.call_one(), 60)
        assert got == {"pids": procs.pids, "sizes": {"procs": 3}, "name": "pm"}
        again = await asyncio.wait_for(spawner.siblings.call_one(), 60)  # procs still serve
        assert again["pids"] == procs.pids
