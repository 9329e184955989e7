"""``exec_command``: run a command on the hosts of a host mesh (Monarch's
``monarch.job.exec_command``, behind ``danaus exec``), through one :class:`CommandActor`
per proc spawned for the purpose and stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, TypedDict

from ..actors.seam import Actor, Future, context, current_runtime, endpoint, run_task
from ..geometry import Point
from ..mesh.seam import check_per_host

if TYPE_CHECKING:
    from ..mesh import HostMesh

__all__ = ["CommandActor", "CommandResult", "exec_command", "rank_env"]


class CommandResult(TypedDict):
    returncode: int
    stdout: str
    stderr: str


def rank_env() -> dict[str, str]:
    """Where the running actor is, as Monarch's commands see it: ``MONARCH_RANK_<DIM>``
    and ``MONARCH_SIZE_<DIM>`` for each dimension of its rank."""
    rank = context().actor_instance.rank
    return {
        **{f"MONARCH_RANK_{dim}": str(i) for dim, i in rank.items()},
        **{f"MONARCH_SIZE_{dim}": str(n) for dim, n in rank.sizes.items()},
    }


class CommandActor(Actor):
    """Runs commands as subprocesses of its proc, on its actor thread (the proc's loop
    stays free), with the environment of the proc plus :func:`rank_env`."""

    @endpoint
    def run(
        self,
        cmd: list[str],
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        client_cwd: str | None = None,
        output_dir: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``cmd`` (a Python file or ``-m module`` runs with this proc's Python) and
        return its exit status and output; with ``output_dir`` the output goes to
        ``stdout.txt`` and ``stderr.txt`` there instead (``$SUBDIR`` in it becomes this
        actor's rank, like ``hosts_1``). It runs in ``workdir``, else in the caller's
        folder where that exists here, else in the proc's."""
        if not cmd:
            raise ValueError("exec_command: the command is empty")
        argv = [sys.executable, *cmd] if cmd[0] == "-m" or cmd[0].endswith(".py") else cmd
        run_env = {**os.environ, **rank_env(), **(env or {})}
        cwd = workdir or (client_cwd if client_cwd and os.path.isdir(client_cwd) else None)
        try:
            return self._run(argv, run_env, cwd, output_dir, timeout)
        except (FileNotFoundError, PermissionError) as e:  # as a shell answers
            where = f" (in {cwd})" if cwd and not os.path.isdir(cwd) else ""
            code = 127 if isinstance(e, FileNotFoundError) else 126
            return {"returncode": code, "stdout": "", "stderr": f"{argv[0]}: {e}{where}\n"}

    def _run(
        self,
        argv: list[str],
        run_env: dict[str, str],
        cwd: str | None,
        output_dir: str | None,
        timeout: float | None,
    ) -> CommandResult:
        with contextlib.ExitStack() as files:
            out: int | IO[bytes] = subprocess.PIPE
            err: int | IO[bytes] = subprocess.PIPE
            if output_dir is not None:  # to files on this host, a folder per rank
                rank = context().actor_instance.rank
                folder = output_dir.replace(
                    "$SUBDIR", "_".join(f"{d}_{i}" for d, i in rank.items())
                )
                os.makedirs(folder, exist_ok=True)
                out = files.enter_context(open(os.path.join(folder, "stdout.txt"), "wb"))
                err = files.enter_context(open(os.path.join(folder, "stderr.txt"), "wb"))
            done = subprocess.run(
                argv,
                env=run_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                timeout=timeout,
                check=False,
            )
        return {
            "returncode": done.returncode,
            "stdout": (done.stdout or b"").decode(errors="backslashreplace"),
            "stderr": (done.stderr or b"").decode(errors="backslashreplace"),
        }


def _point_of(rank: int, sizes: Mapping[str, int]) -> dict[str, int]:
    """The point of flat ``rank`` in a mesh of ``sizes`` (row-major, as ``flatten``)."""
    total = 1
    for n in sizes.values():
        total *= n
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < total:
        raise IndexError(f"rank {rank!r} is out of range for a mesh of {total} ({sizes})")
    return dict(Point.from_rank(rank, sizes))


def exec_command(
    host_mesh: HostMesh,
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: Mapping[str, int] | None = None,
    per_host: Mapping[str, int] | None = None,
    timeout: float | None = None,
) -> Future[int]:
    """Run ``cmd`` on the hosts of ``host_mesh`` (Monarch's ``exec_command``): on every
    one, on the host at ``point`` (``{"hosts": 1}``), or on flat ``rank``; ``per_host``
    runs it that many times per host (``{"gpus": 4}``), each with its
    ``MONARCH_RANK_<DIM>`` / ``MONARCH_SIZE_<DIM>``.

    The output of each run is printed here, in rank order, unless ``output_dir`` sends
    it to files on the hosts. A Future of the highest exit status of all runs (0: every
    one succeeded); ``.get()`` it, or ``await`` it.

    Each run sees ``MONARCH_RANK_<DIM>`` and ``MONARCH_SIZE_<DIM>`` for each dim of its
    rank, the host mesh's dims that ``point`` or ``rank`` chose included.

    Raises:
        ValueError: ``rank`` and ``point`` given together, an empty command, a dim the
            mesh does not have, or a bad ``per_host``.
        IndexError: ``rank`` or a coordinate of ``point`` is out of range.

    Raises (through the Future):
        subprocess.TimeoutExpired: a run took longer than ``timeout`` seconds.
    """
    if rank is not None and point is not None:
        raise ValueError("exec_command takes rank or point, not both")
    argv = list(cmd)
    if not argv:
        raise ValueError("exec_command: the command is empty")
    sizes = host_mesh.sizes
    if rank is not None:
        point = _point_of(rank, sizes)
    target = host_mesh.slice(**point) if point else host_mesh
    procs_per_host = check_per_host(per_host, target.sizes)
    # The dims the point took away stay in each run's environment: a run on host 1 of 2
    # sees MONARCH_RANK_hosts=1 and MONARCH_SIZE_hosts=2, as it would running on all.
    chosen = {d: i % sizes[d] for d, i in (point or {}).items()}
    run_env = {
        **{f"MONARCH_RANK_{d}": str(i) for d, i in chosen.items()},
        **{f"MONARCH_SIZE_{d}": str(sizes[d]) for d in chosen},
        **(env or {}),
    }
    client_cwd = os.getcwd()

    async def run() -> int:
        procs = target.spawn_procs(per_host=procs_per_host, name="exec")
        try:
            runners = await procs.spawn("exec_command", CommandActor)
            results = await runners.run.call(
                argv, run_env, workdir, client_cwd, output_dir, timeout
            )
        finally:
            await procs.stop()
        worst = 0
        for _, result in results.items():
            worst = max(worst, result["returncode"])
            if result["stdout"]:
                print(result["stdout"], end="", flush=True)
            if result["stderr"]:
                print(result["stderr"], end="", file=sys.stderr, flush=True)
        return worst

    return run_task(current_runtime(), run)
