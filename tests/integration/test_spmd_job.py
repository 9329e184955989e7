"""``serve`` / ``SPMDJob`` (Monarch's ``monarch.job.spmd``): hosts reserved once for a
torchrun command, the script run on them again and again, each run training as torchrun
and one process do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from danaus.job import job_load
from danaus.spmd import RankFailure, SPMDJob, serve
from danaus.spmd._job import parse_torchrun

from .test_spmd import SCRIPT, _env, _max_diff

pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
def test_a_served_job_runs_its_script_again_and_again(tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    job = serve(
        ["torchrun", "--nproc-per-node=2", "--standalone", SCRIPT, "--steps", "5", "--out", str(out)],
        scheduler="local_cwd",
    )  # fmt: skip
    try:
        assert isinstance(job, SPMDJob) and len(job.state().workers) == 1
        job.run_spmd()
        first = json.loads(out.read_text())
        assert first["world"] == 2
        out.unlink()
        job.run_spmd()  # the same hosts, a second run
        assert _max_diff(json.loads(out.read_text()), first) < 1e-6
        # saved, a later program runs it on the same reserved hosts
        saved = tmp_path / "job.pkl"
        job.state(cached_path=str(saved))
        again = job_load(str(saved))
        assert isinstance(again, SPMDJob) and again.script == job.script
    finally:
        job.kill()


@pytest.mark.slow
def test_one_process_and_the_served_job_train_alike(tmp_path: Path) -> None:
    one_out, served_out = tmp_path / "one.json", tmp_path / "served.json"
    subprocess.run(
        [sys.executable, SCRIPT, "--steps", "5", "--out", str(one_out)],
        check=True, timeout=120, env=_env(),
    )  # fmt: skip
    job = serve(["python", "-m", "torch.distributed.run", "--nproc_per_node", "2",
                 SCRIPT, "--steps", "5", "--out", str(served_out)])  # fmt: skip
    try:
        job.run_spmd()
    finally:
        job.kill()
    assert _max_diff(json.loads(served_out.read_text()), json.loads(one_out.read_text())) < 1e-5


def test_a_failing_rank_fails_the_run_and_the_hosts_stay() -> None:
    job = serve(["torchrun", "--nproc-per-node=2", SCRIPT, "--fail-rank", "1", "--steps", "50"])
    try:
        with pytest.raises(RankFailure, match="rank"):
            job.run_spmd()
        assert len(job.state().workers) == 1  # still reserved
    finally:
        job.kill()


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["torchrun", "--nnodes=2", "train.py"], "runs on one node; got --nnodes=2"),
        (["bash", "train.sh"], "starts with torchrun"),
        (["torchrun", "--nproc-per-node=gpu", "t.py"], "needs numbers"),
        (["torchrun", "--rdzv-conf", "x=1", "t.py"], "does not read: --rdzv-conf"),
        ([], "the command is empty"),
    ],
)
def test_commands_it_cannot_run_are_named(command: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        serve(command)


def test_its_command_forms_and_schedulers() -> None:
    assert parse_torchrun(["python", "train.py", "--lr", "1"]) == (["train.py", "--lr", "1"], 1, 1)
    assert parse_torchrun(["torchrun", "--nproc_per_node", "4", "-m", "pkg.train", "-x"]) == (
        ["-m", "pkg.train", "-x"], 4, 1,
    )  # fmt: skip
    role = SimpleNamespace(
        entrypoint="torchrun", args=["--nnodes=2", "--nproc-per-node=8", "t.py"], num_replicas=2
    )
    with pytest.raises(ValueError, match="takes no scheduler_cfg"):
        serve(SimpleNamespace(roles=[role]), scheduler="local_cwd", scheduler_cfg={"x": 1})
    with pytest.raises(ValueError, match="danaus serves local_cwd"):
        serve(["torchrun", "t.py"], scheduler="mast_conda")
    with pytest.raises(ValueError, match="one role, not 2"):
        serve(SimpleNamespace(roles=[role, role]))
