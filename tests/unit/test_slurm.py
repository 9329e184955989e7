"""SLURM host lists, and danaus.job.SlurmJob's spec and batch script (without SLURM)."""

from __future__ import annotations

import pytest

from danaus.job._hostlist import expand_hostlist


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
        ("a[8-11]", ["a8", "a9", "a10", "a11"]),
        ("rack[1-2]-n", ["rack1-n", "rack2-n"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_bad_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="bad range"):
        expand_hostlist("n[5-2]")


# ------------------------------------------------- danaus.job.SlurmJob, without SLURM


def test_a_job_spec_is_checked() -> None:
    from danaus.job import SlurmJob

    with pytest.raises(ValueError, match="at least one mesh"):
        SlurmJob(meshes={})
    with pytest.raises(ValueError, match="'hosts' needs a positive number of nodes, not 0"):
        SlurmJob(meshes={"hosts": 0})
    with pytest.raises(ValueError, match="must be an identifier"):
        SlurmJob(meshes={"my hosts": 1})
    with pytest.raises(ValueError, match="one host agent per node"):
        SlurmJob(meshes={"hosts": 1}, ntasks_per_node=8)
    with pytest.raises(ValueError, match=r"sbatch options \(--name=value\), not \['gpu'\]"):
        SlurmJob(meshes={"hosts": 1}, slurm_args=["--partition", "gpu"])
    with pytest.raises(ValueError, match=r"monarch_port must be 0\.\.65535"):
        SlurmJob(meshes={"hosts": 1}, monarch_port=70000)


def test_current_allocation_needs_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from danaus.job import SlurmJob

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ValueError, match="SLURM_JOB_ID is unset"):
        SlurmJob(meshes={"hosts": 1}, job_id="current")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    job = SlurmJob(meshes={"hosts": 1}, job_id="current")
    assert repr(job) == "<SlurmJob {'hosts': 1} not running in allocation 42>"


def test_batch_script_starts_one_agent_per_node() -> None:
    from danaus.job import SlurmJob

    job = SlurmJob(
        meshes={"trainers": 2, "loaders": 1},
        python_exe="/opt/py/bin/python",
        slurm_args=["--constraint=h100"],
        job_name="train",
        time_limit="1:00:00",
        partition="gpu",
        gpus_per_node=8,
        exclusive=True,
        idle_timeout=120,
        env={"A": "x y"},
    )
    script = job.batch_script("/shared/jobs/train-1")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in [
        "#SBATCH --job-name=train",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=/shared/jobs/train-1/slurm-%j.out",
        "#SBATCH --time=1:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=h100",
        "export A='x y'",
    ]:
        assert want in lines
    assert lines[-1] == (
        "exec srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        "/opt/py/bin/python -m danaus.job._agent --dir /shared/jobs/train-1 --port 0 "
        "--idle-timeout 120"
    )
    assert job.nodes == 3 and repr(job) == "<SlurmJob {'trainers': 2, 'loaders': 1} not running>"


def test_a_saved_job_keeps_its_spec_and_can_run_only_the_same() -> None:
    from danaus.job import SlurmJob, job_loads

    job = SlurmJob(meshes={"hosts": 2}, partition="a")
    back = job_loads(job.dumps())
    assert isinstance(back, SlurmJob) and back._spec() == job._spec()
    assert not back.active and back.job_id is None
    # Not running: it cannot serve any spec.
    assert not back.can_run(job)
    assert not job.can_run(SlurmJob(meshes={"hosts": 2}, partition="b"))


def test_job_state_names_its_meshes() -> None:
    from danaus.job import JobState

    state = JobState({})
    with pytest.raises(AttributeError, match="'trainers' is not a host mesh of this job"):
        _ = state.trainers


def test_client_script_is_not_supported() -> None:
    from danaus.job import SlurmJob

    with pytest.raises(NotImplementedError, match="client_script"):
        SlurmJob(meshes={"hosts": 1}).apply(client_script="train.py")
