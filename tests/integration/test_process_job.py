"""``ProcessJob`` (Monarch's ``monarch.job.ProcessJob``): "hosts" that are host agents in
processes of their own on this machine, one per host of each requested mesh."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from danaus import Actor, endpoint
from danaus.job import ProcessJob, job_load

from .lifecycle_actors import Where
from .test_robustness import _wait_gone

pytestmark = pytest.mark.timeout(120)


def _descends_from(pid: int, ancestors: set[int]) -> bool:
    while pid > 1:
        if pid in ancestors:
            return True
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return False


async def test_its_meshes_are_hosts_whose_procs_are_the_workers_children() -> None:
    job = ProcessJob({"trainers": 2, "loaders": 1})
    state = await asyncio.to_thread(job.state)
    try:
        assert (state.trainers.sizes, state.loaders.sizes) == ({"hosts": 2}, {"hosts": 1})
        workers = {p.pid for p in job._workers.values()}
        assert len(workers) == 3
        async with state.trainers.spawn_procs(per_host={"gpus": 2}) as procs:
            where = await procs.spawn("where", Where)
            pids = [pid for _, pid in (await where.where.call()).values()]
            assert len(set(pids)) == 4 and os.getpid() not in pids
            assert all(_descends_from(pid, workers) for pid in pids)
    finally:
        await asyncio.to_thread(job.kill)
    assert not job.active
    assert await asyncio.to_thread(_wait_gone, sorted(workers), 10) == []


def test_a_saved_job_is_reused_while_its_workers_live(tmp_path: Path) -> None:
    path = str(tmp_path / "job.pkl")
    first = ProcessJob({"hosts": 1})
    first.state(cached_path=path)
    try:
        again = ProcessJob({"hosts": 1})
        again.state(cached_path=path)
        assert again.status.name == "CACHED" and again.apply_id == first.apply_id
        assert not job_load(path).can_run(ProcessJob({"hosts": 2}))  # another spec
    finally:
        first.kill()
    assert not job_load(path).can_run(ProcessJob({"hosts": 1}))  # its workers are gone


def test_a_bad_spec_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"got 'hosts': 0"):
        ProcessJob({"hosts": 0})
    with pytest.raises(ValueError, match=r"got 'two words': 1"):
        ProcessJob({"two words": 1})


def test_its_workers_end_with_the_controller(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """\
        from danaus.job import ProcessJob
        job = ProcessJob({"hosts": 2})
        job.state()
        print(*[p.pid for p in job._workers.values()], flush=True)
        """  # exits without job.kill()
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    workers = [int(p) for p in done.stdout.split()]
    assert len(workers) == 2
    assert _wait_gone(workers, 10) == []


async def test_host_mesh_initialized_stop_and_async_with(tmp_path: Path) -> None:
    """Monarch's HostMesh.initialized, stop() and ``async with``: the procs spawned on
    the hosts stop on the way out, the hosts (workers) keep running."""
    from danaus import this_host
    from danaus.config import configured
    from danaus.errors import SupervisionError
    from danaus.mesh import attach_to_workers

    await this_host().initialized  # this machine: at once
    job = ProcessJob({"hosts": 2})
    state = await asyncio.to_thread(job.state)
    try:
        async with state.hosts as hosts:
            procs = hosts.spawn_procs(per_host={"p": 1})
            pids = [pid for _, pid in (await procs.spawn("w", Where).where.call()).values()]
        assert await asyncio.to_thread(_wait_gone, pids, 10) == []
        assert all(p.poll() is None for p in job._workers.values())  # the hosts live on
        again = state.hosts.spawn_procs(per_host={"p": 1})  # and serve again
        assert len((await again.spawn("w", Where).where.call()).values()) == 2
        await state.hosts.stop()
        assert again._group.stopped
    finally:
        await asyncio.to_thread(job.kill)
    nowhere = f"unix:{tmp_path}/nobody.sock"
    with configured(mesh_attach_config_timeout="500ms"):  # Monarch's name for attach_timeout
        with pytest.raises(SupervisionError) as failed:
            await attach_to_workers(workers=[nowhere]).initialized
    assert "attach failed: config push failed during attach" in str(failed.value)
    assert f"host agent at {nowhere} cannot be reached" in str(failed.value)


class Settings(Actor):
    @endpoint
    def stuck_warn_after(self) -> float:
        from danaus import config

        return config.stuck_warn_after


async def test_configure_reaches_host_agents_at_attach_and_their_procs() -> None:
    """As Monarch's: what the controller configure()d is pushed to each host agent when
    the host mesh attaches, and reaches the procs spawned from then on."""
    from danaus.config import configured
    from danaus.mesh.seam import agent_ref

    job = ProcessJob({"hosts": 2})
    state = await asyncio.to_thread(job.state)
    try:
        with configured(stuck_warn_after=123.5):
            await state.hosts.initialized
            procs = state.hosts.spawn_procs(per_host={"p": 1})
            got = await procs.spawn("s", Settings).stuck_warn_after.call()
            assert list(got.values()) == [123.5, 123.5]
        for addr in job._addrs.values():
            assert await agent_ref(addr).configure.call_one({}) == {"stuck_warn_after": 123.5}
        # settings changed later reach procs spawned later, not earlier ones
        again = state.hosts.spawn_procs(per_host={"p": 1})
        from danaus import config

        later = await again.spawn("s", Settings).stuck_warn_after.call()
        assert list(later.values()) == [config.stuck_warn_after] * 2 != [123.5] * 2
        await state.hosts.stop()
    finally:
        await asyncio.to_thread(job.kill)


async def test_a_remote_procs_host_mesh_starts_procs_beside_it() -> None:
    job = ProcessJob({"hosts": 2})
    state = await asyncio.to_thread(job.state)
    try:
        workers = [p.pid for p in job._workers.values()]
        async with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            host = procs.slice(hosts=1).host_mesh  # Monarch's: the host of one proc
            async with host.spawn_procs(per_host={"more": 1}) as more:
                where = await more.spawn("where", Where)
                [(_, pid)] = list((await where.where.call()).values())
                first = await procs.slice(hosts=1).spawn("where1", Where)
                [(_, beside)] = list((await first.where.call()).values())
                # both children of the same worker (the second host's agent)
                parents = {w for w in workers if _descends_from(pid, {w})}
                assert parents == {w for w in workers if _descends_from(beside, {w})}
                assert len(parents) == 1 and pid != beside
    finally:
        await asyncio.to_thread(job.kill)
