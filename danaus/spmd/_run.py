"""Running a torchrun-style script on every rank of a mesh, and ``danaus run``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from ..actors._api import Future, Point, current_runtime, run_task
from ..errors import DanausError
from ._env import _setup

if TYPE_CHECKING:
    from ..mesh import HostMesh, ProcMesh


class RankFailure(DanausError):
    """A rank of an SPMD run failed: it raised, or its script exited with a non-zero code.

    Attributes:
        rank: the first rank that failed.
        exit_code: its script's exit code (1 when it raised).
        cause: what it raised (an ``ActorError`` with the rank's traceback), if it did.
    """

    def __init__(self, rank: int, exit_code: int, cause: BaseException | None) -> None:
        self.rank = rank
        self.exit_code = exit_code
        self.cause = cause
        what = f"raised {cause}" if cause is not None else f"exited with code {exit_code}"
        super().__init__(f"rank {rank} {what}")

    def __reduce__(self) -> tuple[type[RankFailure], tuple[int, int, BaseException | None]]:
        return (RankFailure, (self.rank, self.exit_code, self.cause))


async def _run(
    procs: ProcMesh,
    script_args: list[str],
    master_addr: str | None,
    master_port: int | None,
) -> list[int]:
    actors, addr, port, run_id = await _setup(procs, master_addr, master_port, None)
    sizes = dict(procs.sizes)
    n = len(procs)
    tasks = {
        asyncio.ensure_future(
            actors.slice(**dict(Point.from_rank(r, sizes))).main.call_one(
                addr, port, script_args, run_id
            )
        ): r
        for r in range(n)
    }
    codes: list[int] = [0] * n
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=tasks.__getitem__):
                rank = tasks[t]
                exc = t.exception()
                if exc is not None:
                    raise RankFailure(rank, 1, exc)
                codes[rank] = t.result()
                if codes[rank] != 0:
                    raise RankFailure(rank, codes[rank], None)
    except RankFailure:
        # The others may wait forever in a collective for the failed rank: stop them all.
        for t in pending:
            t.cancel()
        await procs.stop(reason="a rank of the SPMD run failed")
        for t in pending:
            try:
                await t
            except BaseException:
                pass
        raise
    return codes


def run_spmd(
    procs: ProcMesh,
    script_args: list[str],
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Future[list[int]]:
    """Run a torchrun-style script (``["train.py", *args]`` or ``["-m", "pkg.train", ...]``)
    on every proc of ``procs``, with torchrun's environment set; ``await`` it or ``.get()``.

    Gives every rank's exit code (all 0). The first rank that raises or exits non-zero
    fails the run with :class:`RankFailure` (carrying its traceback), and the mesh is
    stopped, so no other rank hangs in a collective waiting for it.
    """
    return run_task(current_runtime(), lambda: _run(procs, script_args, master_addr, master_port))


# --- danaus run ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="danaus run",
        description="Run a torchrun-style script on danaus procs (torchrun's common flags).",
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    p.add_argument(
        "--nnodes",
        default=None,
        help="number of hosts; with --hosts it must match, without it only 1",
    )
    p.add_argument(
        "--hosts",
        default="",
        help="comma-separated host-agent addresses (tcp://HOST:PORT) to run on; key from "
        "$DANAUS_AUTH_KEY. Default: this host only",
    )
    p.add_argument(
        "--slurm-nodes",
        type=int,
        default=0,
        help="run on N nodes of a SLURM job: a new one (sbatch), or the allocation given "
        "by --slurm-job-id, or the one this command runs inside",
    )
    p.add_argument("--slurm-job-id", default=None, help="an existing SLURM job to run on")
    p.add_argument("--partition", default=None, help="SLURM partition for a new job")
    p.add_argument(
        "--slurm-shared",
        action="store_true",
        help="let the new SLURM job share its nodes (default: exclusive nodes)",
    )
    p.add_argument("--master-addr", "--master_addr", default=None)
    p.add_argument("--master-port", "--master_port", type=int, default=None)
    p.add_argument("--standalone", action="store_true", help="accepted (this is the default)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="accepted; unused")
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module")
    p.add_argument("script", help="the script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main_run(argv: list[str]) -> int:
    """``danaus run``: returns the process exit code (0, or the failed rank's)."""
    ns = _parser().parse_args(argv)
    if ns.nproc_per_node < 1:
        sys.exit(f"danaus run: --nproc-per-node must be >= 1, got {ns.nproc_per_node}")
    hosts = [h for h in ns.hosts.split(",") if h]
    if hosts and ns.slurm_nodes:
        sys.exit("danaus run: give --hosts or --slurm-nodes, not both")
    if ns.nnodes is not None:
        nnodes = int(str(ns.nnodes).split(":")[-1])
        if nnodes != max(1, len(hosts), ns.slurm_nodes):
            sys.exit(
                f"danaus run: --nnodes {ns.nnodes} but {max(1, len(hosts), ns.slurm_nodes)} "
                "host(s) (give one host-agent address per node with --hosts, or --slurm-nodes)"
            )
    if (ns.master_addr is None) != (ns.master_port is None):
        sys.exit("danaus run: give both --master-addr and --master-port, or neither")
    from ..mesh import attach_to_hosts, this_host

    job = None
    if ns.slurm_nodes:
        from ..job import SlurmJob

        job = SlurmJob(
            meshes={"hosts": ns.slurm_nodes},
            partition=ns.partition,
            exclusive=not ns.slurm_shared,
            job_id=ns.slurm_job_id,
        )
        mesh_hosts: HostMesh = job.state().hosts
    else:
        mesh_hosts = attach_to_hosts(hosts) if hosts else this_host()
    try:
        return _run_on(mesh_hosts, ns)
    finally:
        if job is not None:
            job.kill()


def _run_on(mesh_hosts: HostMesh, ns: argparse.Namespace) -> int:
    procs = mesh_hosts.spawn_procs(per_host={"gpus": ns.nproc_per_node}, name="rank")
    script = ["-m", ns.script, *ns.args] if ns.module else [ns.script, *ns.args]
    try:
        run_spmd(procs, script, ns.master_addr, ns.master_port).get()
    except RankFailure as e:
        print(f"danaus run: {e}", file=sys.stderr, flush=True)
        return e.exit_code or 1
    except Exception as e:
        print(f"danaus run: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        procs.stop().get(timeout=60)
        return 1
    procs.stop().get(timeout=60)
    return 0
