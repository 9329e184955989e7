"""A real SLURM cluster for the tests: ``scripts/slurm_cluster.sh`` started once (per
mode) and always stopped. Where SLURM is missing and cannot be installed
(not root, no network), the tests that need it skip, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
#: installing takes about 6 s, an `apt-get update` first about 20 s more
INSTALL_TIMEOUT = 600
START_TIMEOUT = 60


class Cluster(NamedTuple):
    conf: str  # SLURM_CONF
    dir: str
    mode: str  # "loopback" or "netns"
    nodes: list[str]
    addrs: list[str]

    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=self.conf)


def _installed() -> bool:
    return all(
        shutil.which(p) or os.access(f"/usr/sbin/{p}", os.X_OK)
        for p in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel")
    )


def ensure_slurm() -> None:
    """Install SLURM if it is missing; skip (with the reason) if that cannot be done."""
    if _installed():
        return
    if os.geteuid() != 0:
        pytest.skip("SLURM is not installed and installing it needs root")
    try:
        out = subprocess.run(
            ["bash", os.path.join(SCRIPTS, "install_slurm.sh")],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"SLURM is not installed and installing it took over {INSTALL_TIMEOUT} s")
    if out.returncode != 0 or not _installed():
        pytest.skip(f"SLURM is not installed and could not be: {out.stderr.strip()[-500:]}")


def start_cluster(nodes: int = 2, mode: str = "loopback") -> Cluster:
    ensure_slurm()
    if os.geteuid() != 0:
        pytest.skip("a local SLURM cluster needs root (slurmd, munged)")
    if not os.path.isdir("/sys/fs/cgroup") or not os.listdir("/sys/fs/cgroup"):
        pytest.skip("slurmd 22.05 needs a cgroup file system at /sys/fs/cgroup; none here")
    if mode == "netns" and not shutil.which("nsenter"):
        pytest.skip("netns mode needs nsenter (util-linux)")
    out = subprocess.run(
        [os.path.join(SCRIPTS, "slurm_cluster.sh"), "start", "--nodes", str(nodes), "--mode", mode],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    if out.returncode != 0 and "a netns cluster already runs" in out.stderr:
        pytest.skip(f"netns mode: {out.stderr.strip()} (one per machine)")
    if out.returncode != 0:
        raise RuntimeError(f"slurm_cluster.sh start failed:\n{out.stderr}")
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    from danaus.job._hostlist import expand_hostlist

    return Cluster(
        conf=values["SLURM_CONF"],
        dir=values["SLURM_CLUSTER_DIR"],
        mode=values["SLURM_CLUSTER_MODE"],
        nodes=expand_hostlist(values["SLURM_CLUSTER_NODES"]),
        addrs=values["SLURM_CLUSTER_ADDRS"].split(","),
    )


def stop_cluster(cluster: Cluster) -> None:
    subprocess.run(
        [os.path.join(SCRIPTS, "slurm_cluster.sh"), "stop", "--dir", cluster.dir],
        check=True,
        timeout=START_TIMEOUT,
    )


# netns (each node its own address and hostname) is what a real cluster looks like, and
# costs a cluster of its own: make test runs loopback, make test-all both
@pytest.fixture(scope="module", params=["loopback", pytest.param("netns", marks=pytest.mark.slow)])
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 2-node cluster per mode, started once for the module that uses it (one module
    does) and stopped at its end, not the session's: a machine runs one netns cluster
    at a time, and other test sessions may want it. One runs at a time."""
    cluster = start_cluster(2, request.param)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
