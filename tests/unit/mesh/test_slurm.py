"""SlurmJob builds the srun command that starts one host agent per node."""

from __future__ import annotations

import shlex

import pytest

from danaus.mesh._slurm import SlurmJob, expand_hostlist


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


def test_srun_command_starts_one_agent_per_node() -> None:
    job = SlurmJob(
        port=26601,
        key_file="/shared/key",
        nodelist="gpu[1-3]",
        nodes=2,
        python="/opt/py/bin/python",
        srun_args=["--partition=gpu"],
        env={"X": "1"},
    )
    cmd = job.srun_command()
    assert cmd[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--ntasks=2",
        "--nodelist=gpu1,gpu2",
        "--job-name=danaus-agents",
    ]
    assert "--partition=gpu" in cmd and "--export=ALL,X=1" in cmd
    assert cmd[-3:-1] == ["bash", "-c"]
    shell = cmd[-1]
    assert shell == (
        "exec /opt/py/bin/python -m danaus host-agent "
        "--listen tcp://$(hostname):26601 --key-file /shared/key"
    )
    assert shlex.split(shell)[0] == "exec"
    assert job.addresses() == ["tcp://gpu1:26601", "tcp://gpu2:26601"]


def test_nodelist_comes_from_the_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert SlurmJob().addresses() == ["tcp://n1:26600", "tcp://n2:26600"]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST"):
        SlurmJob().hosts()


def test_too_many_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match="allocation has 2"):
        SlurmJob(nodelist="n[1-2]", nodes=3).hosts()
