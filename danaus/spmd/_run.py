"""Running a torchrun-style script on every rank of a mesh, and ``danaus run``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..actors.seam import Future, current_runtime, run_task
from ..errors import DanausError
from ..geometry import Point
from ..mesh import ValueMesh
from ._env import _setup

if TYPE_CHECKING:
    from ..mesh import HostMesh, ProcMesh

T = TypeVar("T")


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


#: how long a launch's actors get to stop when it has ended
ACTORS_STOP_S = 10.0

#: what a collective raises on a rank whose peer has left (gloo, NCCL): a consequence of
#: another rank's failure, not its cause
_PEER_LEFT = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|remote process exited|NCCL communicator was aborted"
)


def _the_cause(first: RankFailure, others: list[tuple[int, BaseException | None]]) -> RankFailure:
    """Of the ranks that failed, the one to report: the first whose error is not a
    collective failing because a peer left (replies can come in any order: the rank
    that failed first ends its process group before it replies)."""
    if first.cause is None or not _PEER_LEFT.search(str(first.cause)):
        return first
    for rank, exc in sorted(others, key=lambda p: p[0]):
        if exc is not None and not _PEER_LEFT.search(str(exc)):
            return RankFailure(rank, 1, exc)
    return first


async def _each_rank(
    procs: ProcMesh,
    call: Callable[[Point, int], Awaitable[T]],
    ok: Callable[[T], int],
    grace_s: float = 0.0,
) -> list[T]:
    """``call(point, rank)`` on every rank at once; every result, in rank order.

    The first rank that raises, or whose result ``ok`` gives a non-zero exit code for,
    fails the whole with :class:`RankFailure`, and the mesh is stopped: the other ranks
    may be waiting in a collective for it, forever. With ``grace_s``, they get that long
    to end by themselves first; the procs are stopped only if some have not.
    """
    sizes = dict(procs.sizes)
    n = len(procs)
    tasks = {asyncio.ensure_future(call(Point.from_rank(r, sizes), r)): r for r in range(n)}
    results: list[Any] = [None] * n
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=tasks.__getitem__):
                rank = tasks[t]
                exc = t.exception()
                if exc is not None:
                    raise RankFailure(rank, 1, exc)
                results[rank] = t.result()
                if code := ok(results[rank]):
                    raise RankFailure(rank, code, None)
    except BaseException as e:
        if grace_s > 0 and isinstance(e, RankFailure):
            if pending:
                ended, pending = await asyncio.wait(pending, timeout=grace_s)
                e = _the_cause(e, [(tasks[t], t.exception()) for t in ended])
            if not pending:
                raise e from None
        for t in pending:
            t.cancel()
        await procs.stop(reason="a rank of the SPMD run failed")
        for t in pending:
            try:
                await t
            except BaseException:
                pass
        raise
    return results


async def _run(
    procs: ProcMesh,
    script_args: list[str],
    master_addr: str | None,
    master_port: int | None,
) -> list[int]:
    actors, addr, port, run_id = await _setup(procs, master_addr, master_port, None)

    def main(point: Point, rank: int) -> Awaitable[int]:
        return actors.slice(**dict(point)).main.call_one(addr, port, script_args, run_id)  # type: ignore[no-any-return]

    return await _each_rank(procs, main, lambda code: code)


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


def launch(
    fn: Callable[..., T], procs: ProcMesh, *args: Any, **kwargs: Any
) -> Future[ValueMesh[T]]:
    """Run ``fn(*args, **kwargs)`` on every proc of ``procs`` at once, with torchrun's
    environment set there (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ... as
    :func:`setup_torch_elastic_env` sets them), and give every rank's result as a
    :class:`ValueMesh`; ``await`` it or ``.get()``.

    What Accelerate's ``notebook_launcher`` does on one machine, on any mesh: a
    ``transformers.Trainer`` or an Accelerate training loop in ``fn`` trains as under
    ``torchrun`` with as many processes. ``fn``, its arguments and its results travel
    pickled (cloudpickle: a function defined in a notebook or ``__main__`` works). Each
    rank's prints and logs reach this process prefixed with the mesh's name and rank.
    A process group ``fn`` leaves initialized is destroyed when it returns, so ``launch``
    can be called again on the same procs.

    Raises:
        RankFailure: the first rank whose ``fn`` raised (its traceback in ``cause``);
            the procs are stopped, as no other rank can finish without it.
    """

    return launch_ranks(fn, procs, args, kwargs=kwargs)


def launch_ranks(
    fn: Callable[..., T],
    procs: ProcMesh,
    args: tuple[Any, ...],
    grace_s: float = 0.0,
    kwargs: dict[str, Any] | None = None,
) -> Future[ValueMesh[T]]:
    """:func:`launch`, with ``grace_s``: once a rank has failed, how long the others get
    to end by themselves (they have failed too, their collectives broken by the failed
    rank's process group ending with it) before the procs are stopped."""

    async def go() -> ValueMesh[T]:
        actors, addr, port, run_id = await _setup(procs, None, None, None)

        def run(point: Point, rank: int) -> Awaitable[T]:
            target = actors.slice(**dict(point))
            return target.run.call_one(fn, args, kwargs or {}, addr, port, run_id)  # type: ignore[no-any-return]

        try:
            return ValueMesh(procs.shape, await _each_rank(procs, run, lambda _: 0, grace_s))
        finally:  # this launch's actors go with it (the procs stay, unless stopped above)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actors.stop("the launch ended"), ACTORS_STOP_S)

    return run_task(current_runtime(), go)


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
