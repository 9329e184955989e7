"""Procs forked by a warm fork server: what they inherit, what they must not, and that
they die with their controller."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from danaus import this_host
from danaus.config import config
from danaus.mesh._process import process
from danaus.mesh._procs import forkserver as _forkserver

from ..faults import danaus_procs
from .fork_actors import CudaProbe, Probe, _socket_inodes
from .test_robustness import _wait_gone


@pytest.fixture
def fresh_server() -> Iterator[None]:
    """A fork server started by this test (and none left behind for the next)."""
    old = (config.spawn_method, list(config.preload))
    _forkserver.stop_fork_server()
    config.spawn_method = "fork"  # also when the suite runs with DANAUS_SPAWN_METHOD=exec
    yield
    config.spawn_method, config.preload = old
    _forkserver.stop_fork_server()


def _server() -> _forkserver.ForkServer:
    server = _forkserver.fork_server()
    assert server is not None
    return server


def _signal_masks(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {
            k: v.strip()
            for k, v in (line.split(":", 1) for line in f)
            if k in ("SigIgn", "SigCgt", "SigBlk")
        }


async def test_procs_are_forked_by_a_server_with_no_threads_or_cuda(fresh_server: None) -> None:
    config.preload = ["numpy", "torch"]
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        probe = await procs.spawn("probe", Probe)
        status = await asyncio.to_thread(_server().status)
        where = (await probe.where.call()).values()
        assert {ppid for _, ppid in where} == {status["pid"]}
        assert sorted(pid for pid, _ in where) == sorted(procs.pids)
        # What was imported in the server is there in the proc, never imported again.
        assert {"danaus", "numpy", "torch"} <= set(status["preloaded"])
        assert (await probe.modules.call()).values() == [["numpy", "torch"]] * 2
        # Fork safety of the server: one Python thread, no CUDA context.
        assert status["python_threads"] == 1
        assert status["cuda_initialized"] is False
        assert status["unsafe"] == ""


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU; none on this machine")
async def test_forked_procs_can_use_cuda_the_server_never_does(fresh_server: None) -> None:
    config.preload = ["torch"]
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        probe = await procs.spawn("probe", CudaProbe)
        assert (await probe.cuda_sum.call()).values() == [4.0, 4.0]
        status = await asyncio.to_thread(_server().status)
        assert "torch" in status["preloaded"] and status["cuda_initialized"] is False


async def test_pids_are_known_as_soon_as_spawn_procs_returns(fresh_server: None) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})  # the server starts now
    try:
        pids = procs.pids  # before anything was awaited, as with exec
        assert all(p > 0 for p in pids), pids
        probe = await procs.spawn("probe", Probe)
        assert [pid for pid, _ in (await probe.where.call()).values()] == pids
    finally:
        await procs.stop()


async def test_a_forked_proc_shares_no_socket_with_the_server(fresh_server: None) -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        probe = await procs.spawn("probe", Probe)
        status = await asyncio.to_thread(_server().status)
        server_sockets = await asyncio.to_thread(_socket_inodes, status["pid"])
        assert server_sockets  # its control socket, at least
        kids = (await probe.socket_inodes.call()).values()
        assert all(k and not k & server_sockets for k in kids)
        assert not kids[0] & kids[1]  # each built its own connections


async def test_random_generators_differ_per_proc(fresh_server: None) -> None:
    config.preload = ["numpy", "torch"]
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        probe = await procs.spawn("probe", Probe)
        draws = (await probe.draws.call()).values()
    for kind in range(3):  # random, numpy, torch
        assert len({d[kind] for d in draws}) == 3, draws


@pytest.mark.slow  # an exec-started proc imports torch afresh (5 s); make test-all runs it
async def test_torch_threads_and_signals_match_an_exec_started_proc(fresh_server: None) -> None:
    config.preload = ["numpy", "torch"]
    seen: dict[str, Any] = {}
    for method in ("exec", "fork"):
        config.spawn_method = method
        for env in ({}, {"OMP_NUM_THREADS": "1"}):
            async with this_host().spawn_procs(per_host={"procs": 2}, env=env) as procs:
                probe = await procs.spawn("probe", Probe)
                threads = (await probe.threads.call()).values()  # both at once
                assert all(t["matmul"] for t in threads)
                seen[f"{method} {env}"] = [t["torch_threads"] for t in threads]
                seen[f"{method} {env} python"] = [t["python_threads"] for t in threads]
                if not env:
                    seen[f"{method} signals"] = _signal_masks(procs.pids[0])
    assert seen["fork {}"] == seen["exec {}"]
    assert seen["fork {} python"] == seen["exec {} python"]  # no thread came along
    assert seen["fork {'OMP_NUM_THREADS': '1'}"] == [1, 1] == seen["exec {'OMP_NUM_THREADS': '1'}"]
    assert seen["fork signals"] == seen["exec signals"]


#: Settings as the controller's environment gives them: every proc reads them at start.
_SETTINGS = {
    "log_level": ("DANAUS_LOG_LEVEL", "INFO"),
    "collective_timeout": ("DANAUS_COLLECTIVE_TIMEOUT", "7.5"),
    "rdma_disable_ibverbs": ("DANAUS_RDMA_DISABLE_IBVERBS", "1"),
    "rdma_backend": ("DANAUS_RDMA_BACKEND", "tcp"),
    "handshake_timeout": ("DANAUS_HANDSHAKE_TIMEOUT", "6"),
}


@pytest.mark.parametrize("method", ["fork", "exec"])
async def test_settings_in_the_environment_reach_the_procs(
    fresh_server: None, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    config.spawn_method = method
    names = [*_SETTINGS, "stop_timeout"]
    expected = {
        "log_level": "INFO",
        "collective_timeout": 7.5,
        "rdma_disable_ibverbs": True,
        "rdma_backend": "tcp",
        "handshake_timeout": 6.0,
        "stop_timeout": 4.0,  # from spawn_procs(env=)
        "root logger": "INFO",  # log_level took effect
    }
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:  # the server starts
        before = await (await procs.spawn("probe", Probe)).settings.call_one(names)
    assert before != expected
    for var, value in _SETTINGS.values():
        monkeypatch.setenv(var, value)  # after the fork server read its environment
    env = {"DANAUS_STOP_TIMEOUT": "4"}
    async with this_host().spawn_procs(per_host={"procs": 2}, env=env) as procs:
        got = await (await procs.spawn("probe", Probe)).settings.call(names)
    assert got.values() == [expected, expected]


async def test_exec_method_starts_fresh_interpreters(fresh_server: None) -> None:
    config.spawn_method = "exec"
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        probe = await procs.spawn("probe", Probe)
        assert {ppid for _, ppid in (await probe.where.call()).values()} == {os.getpid()}
    assert process.fork_server is None  # exec never starts a fork server


async def test_an_import_that_starts_a_thread_falls_back_to_exec(
    fresh_server: None, caplog: pytest.LogCaptureFixture
) -> None:
    config.preload = ["tests.integration.fork_unsafe_module"]
    server = _server()
    await asyncio.wait_for(asyncio.to_thread(server.ready.wait, 60), 70)
    assert "started Python threads ['started-at-import']" in server.unsafe
    with caplog.at_level(logging.WARNING, logger="danaus.procs"):
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            probe = await procs.spawn("probe", Probe)
            assert (await probe.where.call_one())[1] == os.getpid()  # exec'd by us
    assert any("new procs start with exec" in r.message for r in caplog.records)


async def test_the_actor_module_is_preloaded_for_later_procs(fresh_server: None) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        await procs.spawn("probe", Probe).initialized
    server = _server()
    status = await asyncio.to_thread(server.status)
    assert "tests.integration.fork_actors" in status["preloaded"]


async def test_a_host_agent_told_of_a_models_module_forks_later_procs_with_it() -> None:
    """plan() and parallelize() tell their procs' host agents to preload the model's
    module: procs the agent forks later (those that replace lost ones) start with it
    imported; a module not told of is not imported there."""
    import tests.integration.preload_later  # noqa: F401  (a "model's" module, imported here)
    from danaus import attach_to_hosts
    from danaus.mesh.seam import agent_ref, group_of, preload_for

    from .agents_kit import controller_key, host_agents

    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=os.getcwd())
    env.pop("DANAUS_SPAWN_METHOD", None)  # (the agent forks its procs)
    with host_agents(["tcp://127.0.0.2:0"], [env]) as agents, controller_key(key):
        hosts = attach_to_hosts([addr for addr, _ in agents])
        async with hosts.spawn_procs(per_host={"procs": 1}) as procs:
            probe = procs.spawn("probe", Probe)
            assert not await probe.imported.call_one("tests.integration.preload_later")
            preload_for(procs, "tests.integration.preload_later")
            agent = agent_ref(group_of(procs).agent_of(0))
            assert "tests.integration.preload_later" in await agent.preload.call_one([])
        async with hosts.spawn_procs(per_host={"procs": 1}) as later:
            probe = later.spawn("probe", Probe)
            assert await probe.imported.call_one("tests.integration.preload_later")
            assert not await probe.imported.call_one("tests.integration.agents_kit")
            assert (await probe.where.call_one())[1] != agents[0][1].pid  # (forked)


async def test_a_forked_proc_killed_is_reported_with_its_signal(fresh_server: None) -> None:
    from danaus import SupervisionError

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        probe = await procs.spawn("probe", Probe)
        await probe.where.call_one()
        os.kill(procs.pids[0], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="killed by SIGKILL"):
            await asyncio.wait_for(probe.where.call_one(), 30)


_CONTROLLER = textwrap.dedent(
    """
    import json, sys
    from danaus import this_host
    from danaus.mesh._process import process
    from tests.integration.fork_actors import Probe

    procs = this_host().spawn_procs(per_host={"procs": 2})
    procs.spawn("probe", Probe).where.call().get(timeout=60)
    server = process.fork_server
    pid = server.status()["pid"] if server is not None else None
    print(json.dumps({"procs": procs.pids, "server": pid}), flush=True)
    sys.stdin.read()  # until killed
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "exec"])
def test_a_killed_controller_takes_its_server_and_procs_along(method: str) -> None:
    ctl = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd(), DANAUS_SPAWN_METHOD=method),
    )
    try:
        assert ctl.stdout is not None
        info = json.loads(ctl.stdout.readline())
        assert sorted(danaus_procs(ctl.pid)) == sorted(info["procs"])
        everything = [*info["procs"], *([info["server"]] if method == "fork" else [])]
        assert (info["server"] is not None) == (method == "fork")
        assert danaus_procs(ctl.pid, servers=True) == sorted(everything)
        ctl.kill()
        ctl.wait(timeout=10)
        left = _wait_gone(everything, 10)
        assert left == [], f"outlived their controller: {left}"
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait(timeout=10)
        for pipe in (ctl.stdin, ctl.stdout):
            if pipe is not None:
                pipe.close()


async def test_with_python_executable_starts_procs_with_that_python(
    fresh_server: None, tmp_path: Any
) -> None:
    wrapper = tmp_path / "python-wrapper"
    # the wrapper stamps its own pid: each run of it stamps another
    wrapper.write_text(f'#!/bin/sh\nDANAUS_TEST_WRAPPED=$$ exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    hosts = this_host().with_python_executable(str(wrapper))
    async with hosts.spawn_procs(per_host={"procs": 2}) as procs:
        probe = await procs.spawn("probe", Probe)
        pids = (await probe.environ.call("DANAUS_TEST_WRAPPED")).values()
        assert all(pids) and pids == [str(pid) for pid, _ in (await probe.where.call()).values()]
        assert {ppid for _, ppid in (await probe.where.call()).values()} == {os.getpid()}
        # procs those procs spawn run it too: the wrapper ran again (Monarch's)
        nested = await probe.slice(procs=0).nested_environ.call_one("DANAUS_TEST_WRAPPED")
        assert nested and nested not in pids
    with pytest.raises(ValueError, match="is not an executable file"):
        this_host().with_python_executable(str(tmp_path / "missing"))


async def test_bootstrap_command_per_point_and_proc_bind(fresh_server: None, tmp_path: Any) -> None:
    from danaus import BootstrapCommand, Point, default_bootstrap_cmd

    assert default_bootstrap_cmd().program == sys.executable
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nDANAUS_TEST_WRAPPED=yes exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)

    def command(point: Point) -> BootstrapCommand:
        return BootstrapCommand(str(wrapper)).with_env({"WHICH": f"proc {point.rank}"})

    cpu = min(os.sched_getaffinity(0))
    async with this_host().spawn_procs(
        per_host={"procs": 2},
        bootstrap_command=command,
        proc_bind=[{"cpus": str(cpu)}, {"physcpubind": str(cpu)}],
    ) as procs:
        probe = await procs.spawn("probe", Probe)
        assert (await probe.environ.call("WHICH")).values() == ["proc 0", "proc 1"]
        assert (await probe.environ.call("DANAUS_TEST_WRAPPED")).values() == ["yes", "yes"]
        assert (await probe.affinity.call()).values() == [[cpu], [cpu]]
    with pytest.raises(ValueError, match="args must be"):
        this_host().spawn_procs(bootstrap_command=BootstrapCommand(sys.executable, args=["x"]))
    with pytest.raises(ValueError, match="needs one per proc of a host"):
        this_host().spawn_procs(per_host={"procs": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="NUMA binding needs numactl"):
        this_host().spawn_procs(proc_bind=[{"membind": "0"}])
