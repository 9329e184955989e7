"""SLURM benchmark: time from ``SlurmJob.apply()`` to the first call answered on 2 nodes.

Runs on a throw-away 2-node SLURM cluster on this machine (``scripts/slurm_cluster.sh``,
loopback mode; SLURM is installed with ``scripts/install_slurm.sh`` if missing and
possible). Each run: ``apply()`` (sbatch), ``state()`` (the job runs, both agents
report, the controller holds the job), ``spawn_procs`` (a proc per node) and ``spawn``
(an actor each), and one call to both; then ``kill()``. Floors from the same run: a bare
``srun -N2 true``, and a batch job whose ``srun -N2`` tasks each write a file, timed
from ``sbatch`` until both files are there (how the agents report). slurmctld starts
batch jobs only on its 1 s scheduling tick, so each submission goes out at a random
phase of it, floor and danaus interleaved; medians and minimums are printed.

``python -m bench.bench_slurm [runs]``
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from danaus import Actor, endpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


class Where(Actor):
    @endpoint
    def node(self) -> str:
        return os.environ.get("SLURMD_NODENAME", "")


def _start() -> tuple[str, str] | str:
    """``(SLURM_CONF, cluster dir)`` of a fresh cluster, or why there is none."""
    if os.geteuid() != 0:
        return "needs root (a local SLURM cluster)"
    inst = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "install_slurm.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if inst.returncode != 0:
        return f"SLURM is not installed and could not be: {inst.stderr.strip()}"
    out = subprocess.run(
        [os.path.join(SCRIPTS, "slurm_cluster.sh"), "start", "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        return f"the cluster did not start: {out.stderr.strip()}"
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return values["SLURM_CONF"], values["SLURM_CLUSTER_DIR"]


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _run(args: list[str]) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def _batch_floor(log_dir: str, i: int) -> float:
    """sbatch a job whose ``srun -N2`` tasks each write a file; the time until both are
    there, polled as SlurmJob polls for its agents' addresses."""
    from danaus.job._job_dir import POLL_INTERVAL

    folder = os.path.join(log_dir, f"floor-{i}")
    os.makedirs(folder)
    script = f"#!/bin/bash\nexec srun -N2 -n2 bash -c 'touch {folder}/$SLURM_NODEID'\n"
    t = time.perf_counter()
    out = subprocess.run(
        ["sbatch", "--parsable", "-N2", "-o", "/dev/null"],
        input=script,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError(f"floor batch job {out.stdout.strip()} did not run in 60 s")
        time.sleep(POLL_INTERVAL)
    took = time.perf_counter() - t
    _wait_ended(out.stdout.strip().split(";")[0])
    return took


def _wait_ended(job_id: str | None) -> None:
    """Until the job has left its nodes, so the next run starts on idle ones (bounded)."""
    from danaus.job._squeue import TERMINAL, job_status

    deadline = time.monotonic() + 30
    while job_id is not None and time.monotonic() < deadline:
        status = job_status(job_id)
        if status is None or status[0] in TERMINAL:
            return
        time.sleep(0.02)


def _one_job(log_dir: str) -> dict[str, float]:
    from danaus.job import SlurmJob

    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    job = SlurmJob(
        meshes={"hosts": 2},
        exclusive=False,
        log_dir=log_dir,
        job_start_timeout=60,
        env={"PYTHONPATH": ROOT},
    )
    job.apply()
    marks["sbatch"] = time.perf_counter() - t0
    try:
        hosts = job.state().hosts
        marks["agents attached"] = time.perf_counter() - t0
        procs = hosts.spawn_procs(per_host={"procs": 1})
        from bench.bench_slurm import Where as where  # by its importable name, not __main__

        nodes = procs.spawn("where", where).node.call().get(timeout=60).values()
        marks["first call answered"] = time.perf_counter() - t0
        if len(set(nodes)) != 2:
            raise RuntimeError(f"the procs did not run on 2 nodes: {nodes}")
        procs.stop().get(timeout=60)
    finally:
        job_id = job.job_id
        job.kill()
    _wait_ended(job_id)
    return marks


def main(runs: int = 5) -> None:
    from danaus.mesh import set_unhandled_fault_hook

    started = _start()
    if isinstance(started, str):
        print(f"skipped: {started}")
        return
    conf, cluster = started
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    set_unhandled_fault_hook(lambda f: None)  # kill() ends the jobs on purpose
    try:
        with tempfile.TemporaryDirectory() as log_dir:
            # The first batch job after a cluster starts waits for the scheduler's first
            # pass (about 3 s): warm it up once, for the floors and danaus alike.
            first = _one_job(log_dir)
            srun = [_timed(lambda: _run(["srun", "-N2", "-n2", "true"])) for _ in range(runs)]
            # Interleaved, so that the floor and danaus meet the same scheduler; each
            # submitted at a random phase of slurmctld's 1 s scheduling tick (batch jobs
            # start only on that tick), so that neither gets a systematically lucky one.
            rng = random.Random(0)
            batch, jobs = [], []
            for i in range(runs):
                time.sleep(rng.random())
                batch.append(_batch_floor(log_dir, i))
                time.sleep(rng.random())
                jobs.append(_one_job(log_dir))
    finally:
        if old is None:
            del os.environ["SLURM_CONF"]
        else:
            os.environ["SLURM_CONF"] = old
        subprocess.run(
            [os.path.join(SCRIPTS, "slurm_cluster.sh"), "stop", "--dir", cluster],
            check=True,
            timeout=60,
        )

    def med(xs: list[float]) -> float:
        return statistics.median(xs) * 1e3

    def low(xs: list[float]) -> float:
        return min(xs) * 1e3

    call = [j["first call answered"] for j in jobs]
    print(f"2 nodes, loopback mode, {runs} runs (ms):        median      min")
    for mark in ("sbatch", "agents attached", "first call answered"):
        xs = [j[mark] for j in jobs]
        print(f"  apply() -> {mark:<20} {med(xs):8.1f} {low(xs):8.1f}")
    print(f"  floor: srun -N2 true             {med(srun):8.1f} {low(srun):8.1f}")
    print(f"  floor: sbatch, srun -N2 touch    {med(batch):8.1f} {low(batch):8.1f}")
    print(f"  ratio of medians: first call / batch floor {med(call) / med(batch):.2f}x")
    print(f"  (first job after cluster start: {first['first call answered'] * 1e3:.1f} ms)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
