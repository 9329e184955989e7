"""`danaus run --slurm-nodes`: a torchrun-style script on the nodes of a real SLURM job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .slurm_cluster import ROOT, Cluster, slurm_cluster  # noqa: F401 (the session fixture)
from .test_slurm import wait_for
from .test_spmd import SCRIPT, _max_diff


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("slurm_cluster", ["loopback"], indirect=True)
def test_danaus_run_on_two_slurm_nodes_equals_one_process(
    slurm_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = dict(slurm_cluster.env(), PYTHONPATH=ROOT)

    def train(*launcher: str) -> dict[str, Any]:
        out = tmp_path / f"w{len(list(tmp_path.glob('w*.json')))}.json"
        r = subprocess.run(
            [*launcher, SCRIPT, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
            cwd=tmp_path,  # the job's directory (./.danaus/jobs) goes there
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return dict(json.loads(out.read_text()))

    one = train(sys.executable)
    two = train(sys.executable, "-m", "danaus", "run", "--slurm-nodes", "2", "--slurm-shared")
    assert two["world"] == 2
    assert _max_diff(two, one) < 1e-5

    def ended() -> bool:  # the job ends with the run (COMPLETING counts as ended)
        states = subprocess.run(
            ["squeue", "-h", "-n", "danaus", "-o", "%T"], capture_output=True, text=True, env=env
        ).stdout.split()
        return not [s for s in states if s != "COMPLETING"]

    wait_for(ended, 30, "the SLURM job to end")
