"""SlurmJob against a real 2-node SLURM cluster on this machine, in loopback mode (nodes on
127.0.0.2/3) and in network namespaces (each node its own IP and hostname)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from danaus import SupervisionError
from danaus.job import SlurmJob, job_load
from danaus.job._squeue import TERMINAL, job_status

from ..faults import danaus_procs
from .slurm_actors import Gloo, Node
from .slurm_cluster import ROOT, Cluster, slurm_cluster  # noqa: F401 (the session fixture)

pytestmark = pytest.mark.timeout(120)

#: For the tests that network namespaces would not change: in loopback mode only.
loopback_only = pytest.mark.parametrize("slurm_cluster", ["loopback"], indirect=True)


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll ``cond`` until it is true; the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ended(job_id: str) -> bool:
    status = job_status(job_id)
    return status is None or status[0] in TERMINAL


def leftovers(agent_pids: list[int], proc_pids: list[int]) -> list[int]:
    """Live agents, the procs and fork servers they started, and the given procs."""
    left = [p for p in agent_pids + proc_pids if alive(p)]
    for a in agent_pids:
        left += danaus_procs(a, servers=True)
    return sorted(set(left))


@pytest.fixture
def slurm(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:  # noqa: F811
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    return slurm_cluster


def new_job(log_dir: Any, **kw: Any) -> SlurmJob:
    kw.setdefault("meshes", {"hosts": 2})
    return SlurmJob(
        exclusive=False,
        log_dir=str(log_dir),
        job_start_timeout=30,
        env={"PYTHONPATH": ROOT},
        **kw,
    )


@pytest.fixture
def job(slurm: Cluster, tmp_path: Any) -> Iterator[SlurmJob]:
    j = new_job(tmp_path)
    try:
        yield j
    finally:
        j.kill()


def test_procs_on_both_nodes_call_across_them(job: SlurmJob, slurm: Cluster) -> None:
    hosts = job.state().hosts
    assert hosts.sizes == {"hosts": 2}
    assert job.job_id is not None and f"running job {job.job_id}" in repr(job)
    with hosts.spawn_procs(per_host={"procs": 2}) as procs:
        nodes = procs.spawn("node", Node)
        where = nodes.where.call().get(timeout=30).values()
        assert [w["node"] for w in where] == [slurm.nodes[0]] * 2 + [slurm.nodes[1]] * 2
        assert {w["job"] for w in where} == {job.job_id}
        for w, addr in zip(where, [slurm.addrs[0]] * 2 + [slurm.addrs[1]] * 2, strict=True):
            assert w["addr"].startswith(f"tcp://{addr}:")  # each proc on its node's address
        if slurm.mode == "netns":
            assert [w["hostname"] for w in where[::2]] == slurm.nodes
        # A proc on the first node calls the procs on the second.
        asked = nodes.slice(hosts=0, procs=0).ask.call_one(nodes.slice(hosts=1, procs=1))
        asked = asked.get(timeout=30)
        assert asked["node"] == slurm.nodes[1] and asked["pid"] == where[3]["pid"]


@loopback_only
def test_kill_cancels_the_job_and_leaves_no_process(job: SlurmJob) -> None:
    procs = job.state().hosts.spawn_procs(per_host={"procs": 1})
    pids = [w["pid"] for w in procs.spawn("node", Node).where.call().get(timeout=30).values()]
    agents = [pid for _, _, pid, _ in job.agents]
    job_id = job.job_id
    assert job_id is not None
    job.kill()
    assert "not running" in repr(job)
    wait_for(lambda: ended(job_id), 15, f"job {job_id} ends after kill()")
    wait_for(lambda: not leftovers(agents, pids), 15, "no agent or proc left")
    procs.stop().get(timeout=30)


def test_scancel_fails_calls_with_supervision_error(job: SlurmJob) -> None:
    procs = job.state().hosts.spawn_procs(per_host={"procs": 1})
    nodes = procs.spawn("node", Node)
    pids = [w["pid"] for w in nodes.where.call().get(timeout=30).values()]
    agents = [pid for _, _, pid, _ in job.agents]
    assert job.job_id is not None
    start = time.monotonic()
    subprocess.run(["scancel", job.job_id], check=True, timeout=30)

    def failed() -> bool:
        try:
            nodes.where.call().get(timeout=10)
        except SupervisionError:
            return True
        return False

    took = wait_for(failed, 10, "calls fail with SupervisionError after scancel")
    print(f"scancel -> SupervisionError in {time.monotonic() - start:.2f} s (poll {took:.2f} s)")
    wait_for(lambda: not leftovers(agents, pids), 15, "no agent or proc left after scancel")
    with pytest.raises(SupervisionError):
        nodes.where.call().get(timeout=10)
    procs.stop().get(timeout=30)


def _end_controllers(slurm: Cluster, job_id: str, *procs: object) -> None:
    """Kill what is left of these controller programs, close their pipes, and cancel the
    job if it still runs."""
    for p in procs:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()
    if not ended(job_id):
        subprocess.run(["scancel", job_id], timeout=30, env=slurm.env())


def _controller(
    slurm: Cluster, log_dir: Any, *args: str, wait: bool = False
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start ``slurm_controller`` and read the JSON line it prints (bounded)."""
    cmd = [sys.executable, "-m", "tests.integration.slurm_controller", str(log_dir), *args]
    if wait:
        cmd.append("--wait")
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=dict(slurm.env(), PYTHONPATH=ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], 60)
    line = p.stdout.readline() if ready else ""
    if not line.startswith("{"):
        p.kill()
        p.wait(timeout=30)
        pytest.fail(f"the controller printed no job line (exit {p.returncode}): {line!r}")
    return p, json.loads(line)


def test_a_killed_controller_takes_its_job_down(slurm: Cluster, tmp_path: Any) -> None:
    p, info = _controller(slurm, tmp_path, wait=True)
    try:
        assert len(info["nodes"]) == 2 and all(alive(pid) for pid in info["procs"])
        assert info["nodes"] == slurm.nodes
        p.kill()
        p.wait(timeout=30)
        procs_gone = wait_for(
            lambda: not any(alive(pid) for pid in info["procs"]), 15, "procs end with controller"
        )
        job_gone = wait_for(lambda: ended(info["job"]), 15, f"job {info['job']} ends")
        wait_for(lambda: not leftovers(info["agents"], info["procs"]), 15, "nothing left")
        print(f"controller SIGKILL -> procs gone {procs_gone:.2f} s, job ended {job_gone:.2f} s")
    finally:
        _end_controllers(slurm, info["job"], p)


@loopback_only
def test_a_saved_job_serves_the_next_controller(slurm: Cluster, tmp_path: Any) -> None:
    cached = str(tmp_path / "job_state.pkl")
    first, one = _controller(slurm, tmp_path, "--cached", cached)
    try:
        assert first.wait(timeout=60) == 0
        # The first controller is gone, its procs with it; the job waits for the next.
        wait_for(lambda: not any(alive(pid) for pid in one["procs"]), 15, "first procs end")
        status = job_status(one["job"])
        assert status is not None and status[0] == "RUNNING"
        saved = job_load(cached)
        assert isinstance(saved, SlurmJob) and saved.job_id == one["job"]
        second, two = _controller(slurm, tmp_path, "--cached", cached, "--kill")
        assert second.wait(timeout=60) == 0
        assert two["job"] == one["job"] and two["agents"] == one["agents"]
        assert set(two["procs"]).isdisjoint(one["procs"])
        wait_for(lambda: ended(one["job"]), 15, "the second controller's kill() ends the job")
    finally:
        _end_controllers(slurm, one["job"], first, locals().get("second"))


@loopback_only
def test_more_nodes_than_the_cluster_has_is_a_clear_error(slurm: Cluster, tmp_path: Any) -> None:
    job = new_job(tmp_path, meshes={"trainers": 2, "loaders": 1})
    with pytest.raises(RuntimeError, match=r"3 nodes\): .*Node count specification invalid"):
        job.apply()
    assert not job.active
    assert not os.listdir(tmp_path)  # no job directory (and no key file) left behind


@loopback_only
def test_a_job_that_does_not_start_in_time_is_cancelled(slurm: Cluster, tmp_path: Any) -> None:
    out = subprocess.run(
        ["salloc", "-N2", "--exclusive", "--no-shell"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    busy = out.stderr.split("Granted job allocation")[1].split()[0]
    try:
        job = SlurmJob(
            meshes={"hosts": 2}, log_dir=str(tmp_path), job_start_timeout=1.0, exclusive=True
        )
        with pytest.raises(TimeoutError, match=r"did not start within 1\.0 s \(it is PENDING\)"):
            job.state()
        assert job.job_id is not None
        wait_for(lambda: ended(job.job_id or ""), 15, "the pending job is cancelled")
        job.kill()
    finally:
        subprocess.run(["scancel", busy], timeout=30)


@loopback_only
def test_an_existing_allocation_runs_the_agents_as_a_step(
    slurm: Cluster, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = subprocess.run(
        ["salloc", "-N2", "--no-shell"], capture_output=True, text=True, timeout=30, check=True
    )
    alloc = out.stderr.split("Granted job allocation")[1].split()[0]
    try:
        monkeypatch.setenv("SLURM_JOB_ID", alloc)  # as inside salloc
        job = new_job(tmp_path, job_id="current")
        hosts = job.state().hosts
        with hosts.spawn_procs(per_host={"procs": 1}) as procs:
            where = procs.spawn("node", Node).where.call().get(timeout=30).values()
            assert [w["job"] for w in where] == [alloc, alloc]
            assert [w["node"] for w in where] == slurm.nodes
        agents = [pid for _, _, pid, _ in job.agents]
        job.kill()  # ends our step, not the allocation
        wait_for(lambda: not leftovers(agents, []), 15, "agents end with their step")
        status = job_status(alloc)
        assert status is not None and status[0] == "RUNNING"
    finally:
        subprocess.run(["scancel", alloc], timeout=30)


@loopback_only
def test_tensor_engine_reduce_across_nodes(job: SlurmJob) -> None:
    torch = pytest.importorskip("torch")
    from danaus.tensor_engine import inspect

    with job.state().hosts.spawn_procs(per_host={"procs": 1}) as procs:
        with procs.activate():
            x = torch.arange(4.0) + torch.rand(4)
            total = x.reduce("hosts", "sum")
        s0, s1 = (inspect(x, hosts=h, procs=0) for h in range(2))
        for h in range(2):
            torch.testing.assert_close(inspect(total, hosts=h, procs=0), s0 + s1)


def test_gloo_all_reduce_across_nodes(job: SlurmJob, slurm: Cluster) -> None:
    pytest.importorskip("torch")
    from danaus.spmd import setup_torch_elastic_env

    with job.state().hosts.spawn_procs(per_host={"procs": 1}) as procs:
        setup_torch_elastic_env(procs)
        out = procs.spawn("gloo", Gloo).all_reduce.call(1.5).get(timeout=60).values()
        assert [o["sum"] for o in out] == [3.0, 3.0]
        assert [(o["rank"], o["world"]) for o in out] == [(0, 2), (1, 2)]
        assert [o["node"] for o in out] == slurm.nodes
        assert {o["master"] for o in out} == {slurm.addrs[0]}


def test_ddp_step_across_nodes_averages_the_gradients(job: SlurmJob) -> None:
    pytest.importorskip("torch")
    from danaus.spmd import setup_torch_elastic_env

    with job.state().hosts.spawn_procs(per_host={"procs": 1}) as procs:
        setup_torch_elastic_env(procs)
        out = procs.spawn("ddp", Gloo).ddp_step.call().get(timeout=60).values()
        mean = [(a + b) / 2 for a, b in zip(out[0]["local"][0], out[1]["local"][0], strict=True)]
        assert out[0]["local"] != out[1]["local"]  # each rank had its own batch
        for o in out:
            assert o["grad"][0] == pytest.approx(mean)


@loopback_only
def test_a_job_no_controller_attaches_to_ends_after_idle_timeout(
    slurm: Cluster, tmp_path: Any
) -> None:
    job = new_job(tmp_path, idle_timeout=0.5)
    job.apply()
    job_id = job.job_id
    assert job_id is not None
    try:
        took = wait_for(lambda: ended(job_id), 20, "the unattached job ends by itself")
        print(f"unattached job ended {took:.2f} s after sbatch (idle_timeout 0.5 s)")
    finally:
        job.kill()


@loopback_only
def test_a_dead_agent_ends_the_job(job: SlurmJob) -> None:
    """A node's agent that dies (SIGKILL) takes the job down with it
    (``--kill-on-bad-exit``): the controller's calls fail, nothing is left."""
    procs = job.state().hosts.spawn_procs(per_host={"procs": 1})
    nodes = procs.spawn("node", Node)
    pids = [w["pid"] for w in nodes.where.call().get(timeout=30).values()]
    agents = [pid for _, _, pid, _ in job.agents]
    os.kill(agents[1], signal.SIGKILL)
    assert job.job_id is not None
    job_id = job.job_id
    wait_for(lambda: ended(job_id), 15, "the job ends when one agent dies")
    wait_for(lambda: not leftovers(agents, pids), 15, "no agent or proc left")
    with pytest.raises(SupervisionError):
        nodes.where.call().get(timeout=10)
    procs.stop().get(timeout=30)


@loopback_only
def test_the_job_verbs_drive_a_slurm_job(slurm: Cluster, tmp_path: Any) -> None:
    """``danaus apply`` submits the job and leaves it for later commands; ``danaus exec``
    runs on its nodes; ``danaus kill`` cancels it, as a person types them."""
    (tmp_path / "slurmjob.py").write_text(
        "from danaus.job import SlurmJob\n"
        f"job = SlurmJob(meshes={{'hosts': 2}}, exclusive=False, log_dir={str(tmp_path)!r}, "
        f"job_start_timeout=30, env={{'PYTHONPATH': {ROOT!r}}})\n"
    )

    def danaus(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "danaus", *args],
            cwd=tmp_path,
            env=slurm.env(),
            capture_output=True,
            text=True,
            timeout=90,
        )

    applied = danaus("apply", "slurmjob.job")
    assert applied.returncode == 0, applied.stderr
    saved = job_load(str(tmp_path / ".monarch" / "job_state.pkl"))
    assert isinstance(saved, SlurmJob) and saved.job_id is not None
    job_id = saved.job_id
    try:
        assert job_status(job_id) is not None and not ended(job_id)  # it outlived apply
        ran = danaus("exec", "--point", "hosts=1", "--", "sh", "-c", "echo $SLURM_JOB_ID")
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == job_id  # run inside the job's allocation
        info = danaus("info")
        assert "job: running" in info.stdout and "hosts: 2 hosts" in info.stdout
        killed = danaus("kill")
        assert killed.returncode == 0 and "Killed the job" in killed.stdout
        wait_for(lambda: ended(job_id), 15, f"job {job_id} ends after danaus kill")
    finally:
        if not ended(job_id):
            subprocess.run(["scancel", job_id], timeout=30, env=slurm.env())


@loopback_only
def test_an_out_of_cluster_controller_reaches_its_job_through_the_first_node(
    slurm: Cluster, tmp_path: Any
) -> None:
    p, info = _controller(slurm, tmp_path, "--out-of-cluster", "--kill")
    try:
        assert p.wait(timeout=60) == 0
        assert info["nodes"] == slurm.nodes  # the meshes {"hosts": 1} and add_mesh's
        gateway = info["gateway"]
        first = info["agent_addrs"][0]
        host = first[len("tcp://") :].rpartition(":")[0]
        # the controller is known by an address on the first node, where its gateway is
        assert gateway["addr"].startswith(f"tcp://{host}:")
        # it dialed both nodes' procs through the first node's agent
        assert gateway["counts"]["dialed"] >= 2 and gateway["counts"]["reserved"] == 1
    finally:
        _end_controllers(slurm, info["job"], p)


def test_share_node_takes_a_share_of_a_node_of_the_partition(slurm: Cluster, tmp_path: Any) -> None:
    job = new_job(tmp_path)
    job.share_node(tasks_per_node=2, gpus_per_task=0, partition="debug")
    script = job.batch_script(str(tmp_path))
    assert "--exclusive" not in script and "#SBATCH --partition=debug" in script
    out = subprocess.run(
        ["sinfo", "-h", "-p", "debug", "-o", "%c|%m"],
        capture_output=True,
        text=True,
        timeout=30,
        env=slurm.env(),
    )
    cpus, mem = out.stdout.split()[0].split("|")
    assert f"#SBATCH --cpus-per-task={max(1, int(cpus) // 2)}" in script
    assert f"#SBATCH --mem={max(1, int(mem) // 2)}M" in script
    with pytest.raises(ValueError, match="not known to sinfo"):
        job.share_node(tasks_per_node=1, gpus_per_task=0, partition="nosuchpartition")


def test_add_mesh_after_apply_is_refused(job: SlurmJob) -> None:
    job.add_mesh("extra", 1)
    assert job.nodes == 3
    with pytest.raises(ValueError, match="positive number of nodes"):
        job.add_mesh("bad", 0)
    job._slurm_job_id = "1"
    try:
        with pytest.raises(RuntimeError, match="before apply"):
            job.add_mesh("late", 1)
    finally:
        job._slurm_job_id = None
