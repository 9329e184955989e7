"""Monarch's ``info`` / ``server_ready`` / ``kill`` / ``kill_and_confirm`` on SLURM
handles, against the real 2-node SLURM cluster of this machine (loopback mode)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from danaus.job import SlurmJob
from danaus.job.server_handles import (
    AppState,
    ServerSpec,
    info,
    is_terminal,
    kill,
    kill_and_confirm,
    server_ready,
)

from .slurm_cluster import ROOT, Cluster, slurm_cluster  # noqa: F401 (the module fixture)

pytestmark = pytest.mark.timeout(120)

#: The cluster in loopback mode only: handles do not depend on the network.
loopback = pytest.mark.parametrize("slurm_cluster", ["loopback"], indirect=True)
FAST = timedelta(seconds=0.05)
T = TypeVar("T")


def run(aw: Awaitable[T], timeout: float = 30) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await aw

    return asyncio.run(bounded())


@pytest.fixture
def slurm(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:  # noqa: F811
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    return slurm_cluster


@pytest.fixture
def sbatch(slurm: Cluster, tmp_path: Any) -> Iterator[Callable[..., tuple[str, str]]]:
    """Submit a 2-node ``sleep`` job: ``(job id, job name)``; cancelled at the end."""
    ids: list[str] = []

    def submit(*options: str, seconds: int = 60) -> tuple[str, str]:
        name = f"srv-{uuid.uuid4().hex[:8]}"
        args = ["sbatch", "--parsable", "--nodes=2", f"--job-name={name}"]
        args += [f"--output={tmp_path}/%j.out", *options, "--wrap", f"sleep {seconds}"]
        out = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        ids.append(out.stdout.strip().split(";")[0])
        return ids[-1], name

    yield submit
    for job_id in ids:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def test_other_schedulers_and_malformed_handles_are_refused() -> None:
    for call in (info, kill, kill_and_confirm):
        with pytest.raises(ValueError, match=r"'kubernetes://ns/app'.*danaus serves slurm"):
            call("kubernetes://ns/app")
    with pytest.raises(ValueError, match=r"'mast_conda:///job'.*danaus serves slurm"):
        run(server_ready("mast_conda:///job"))
    with pytest.raises(ValueError, match=r"'1234' is not a server handle"):
        info("1234")


def test_a_missing_squeue_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="squeue is not installed here"):
        info("slurm:///1")


def test_app_state_has_torchx_names_and_order() -> None:
    assert [s.name for s in sorted(AppState)] == [
        "UNSUBMITTED",
        "SUBMITTED",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "UNKNOWN",
    ]
    assert str(AppState.RUNNING) == "RUNNING"
    assert [s for s in AppState if is_terminal(s)] == [
        AppState.SUCCEEDED,
        AppState.FAILED,
        AppState.CANCELLED,
    ]


@loopback
def test_a_running_job_by_id_and_by_name(
    sbatch: Callable[..., tuple[str, str]], slurm: Cluster
) -> None:
    job_id, name = sbatch()
    handle = f"slurm:///{job_id}"
    spec = run(server_ready(handle, check_interval=FAST))
    assert spec is not None and spec.is_running
    assert spec.state == AppState.RUNNING and spec.name == job_id
    assert spec.server_handle == handle and spec.scheduler == "slurm" and spec.namespace == ""
    assert spec.metadata == {"slurm/job_name": name}
    [mesh] = spec.meshes
    assert (mesh.name, mesh.num_hosts, mesh.state) == (name, 2, AppState.RUNNING)
    assert mesh.hostnames == slurm.nodes  # in node order
    assert spec.host0(name) == slurm.nodes[0]
    assert spec.to_json()["meshes"][name]["hostnames"] == slurm.nodes
    with pytest.raises(ValueError, match=rf"no mesh 'trainers'.*\['{name}'\]"):
        spec.host0("trainers")

    by_name = info(f"slurm:///{name}")  # as Monarch's get_or_create names servers
    assert by_name == spec
    kill_and_confirm(f"slurm:///{name}", timeout_after_kill=30)
    after = info(handle)
    assert after is None or after.state == AppState.CANCELLED
    if after is not None:  # SLURM still remembers it (MinJobAge): it has no hosts now
        assert after.meshes[0].hostnames == []
        with pytest.raises(RuntimeError, match="has ended \\(CANCELLED\\)"):
            after.host0(name)
        assert run(server_ready(handle, check_interval=FAST)) == after  # terminal: at once
    kill(handle)  # an ended job is left as it is
    kill_and_confirm(handle, timeout_after_kill=5)


@loopback
def test_a_pending_job_is_waited_for_then_cancelled(
    sbatch: Callable[..., tuple[str, str]],
) -> None:
    job_id, name = sbatch("--begin=now+600")
    handle = f"slurm:///{job_id}"
    spec = info(handle)
    assert spec is not None and spec.state == AppState.PENDING
    assert (spec.meshes[0].num_hosts, spec.meshes[0].hostnames) == (2, [])
    with pytest.raises(RuntimeError, match=rf"{handle} is PENDING.*server_ready"):
        spec.host0(name)
    with pytest.raises(TimeoutError):  # still pending: server_ready keeps waiting
        run(server_ready(handle, check_interval=FAST), timeout=0.5)
    kill(handle)
    kill_and_confirm(handle, timeout_after_kill=30)
    after = info(handle)
    assert after is None or after.state == AppState.CANCELLED


@loopback
def test_unknown_jobs_are_none(slurm: Cluster) -> None:
    assert info("slurm:///999999") is None
    assert info(f"slurm:///no-such-job-{uuid.uuid4().hex[:8]}") is None
    assert run(server_ready("slurm:///999999", check_interval=FAST)) is None
    kill("slurm:///999999")  # nothing to cancel
    kill_and_confirm("slurm:///999999", timeout_after_kill=1)


@loopback
def test_a_slurm_job_of_danaus_is_found_by_its_handle(slurm: Cluster, tmp_path: Any) -> None:
    name = f"dj-{uuid.uuid4().hex[:8]}"
    job = SlurmJob(
        meshes={"trainers": 1, "loaders": 1},
        job_name=name,
        exclusive=False,
        log_dir=str(tmp_path),
        job_start_timeout=30,
        env={"PYTHONPATH": ROOT},
    )
    try:
        state = job.state()
        assert job.job_id is not None
        spec = info(f"slurm:///{job.job_id}")
        assert isinstance(spec, ServerSpec) and spec.is_running
        assert info(f"slurm:///{name}") == spec
        # one batch job for both meshes, which it records: each mesh with its nodes, in
        # the order danaus's meshes take them
        assert spec.get_mesh_names() == ["trainers", "loaders"]
        nodes = [a.node for a in job.agents]
        assert nodes == slurm.nodes
        for i, mesh in enumerate(spec.meshes):
            assert (mesh.num_hosts, mesh.hostnames, mesh.state) == (1, [nodes[i]], AppState.RUNNING)
        assert spec.host0("loaders") == nodes[1]
        assert state.trainers.sizes == {"hosts": 1}
        kill_and_confirm(spec.server_handle, timeout_after_kill=30)
        after = info(spec.server_handle)
        assert after is None or is_terminal(after.state)
    finally:
        job.kill()
