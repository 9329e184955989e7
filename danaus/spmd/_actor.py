"""``SPMDActor``: one per proc; sets torchrun's environment there and runs scripts."""

from __future__ import annotations

import math
import os
import runpy
import socket
import sys
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from ..actors import Actor, context, current_rank, endpoint
from ..geometry import Point

#: the dim torchrun calls "per node" when a mesh has no dim named like one
_LOCAL_DIMS = ("gpus", "gpu", "procs", "local", "nproc")


def elastic_env(point: Point, master_addr: str, master_port: int, run_id: str) -> dict[str, str]:
    """What torchrun would set for the proc at ``point`` of its mesh.

    The last dim is the one within a node (``LOCAL_RANK``); the dims before it number the
    nodes (``GROUP_RANK``), so ``{"hosts": 2, "gpus": 4}`` gives ranks 0-7, 4 per node.
    """
    sizes = dict(point.sizes)
    if not sizes:
        local_dim, local_size, local_rank = "", 1, 0
    else:
        local_dim = list(sizes)[-1]
        local_size = sizes[local_dim]
        local_rank = int(point[local_dim])
    world = math.prod(sizes.values()) if sizes else 1
    rank = point.rank
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(rank // local_size),
        "GROUP_WORLD_SIZE": str(world // local_size),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def proc_host() -> str:
    """An address of this proc's host that the other procs of its mesh can reach: the
    host of its TCP address (a host agent's proc), else loopback (a local proc)."""
    me = context().actor
    addr = me.proc_addr if me is not None else ""
    if addr.startswith("tcp://"):
        return addr[len("tcp://") :].rpartition(":")[0].strip("[]")
    return "127.0.0.1"


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class SPMDActor(Actor):
    """Sets torchrun's environment variables in its proc and runs torchrun-style scripts.

    Its rank is its place in the mesh that ``setup_env`` (or ``main``) was called on, as
    Monarch's ``current_rank()`` gives it: spawned on a slice of a proc mesh, or called
    through a slice, the ranks count within that slice (see :func:`elastic_env`).
    """

    def __init__(self) -> None:
        me = context().actor
        assert me is not None, "SPMDActor runs in a proc"
        self.point: Point | None = None  # set by setup_env

    @endpoint
    def get_host_port(self, use_ipaddr: object = None) -> tuple[str, int]:
        """An address of this proc's host and a free port on it (for ``MASTER_*``)."""
        host = proc_host()
        return host, _free_port(host)

    @endpoint
    def setup_env(self, master_addr: str, master_port: int, run_id: str = "") -> None:
        """Set torchrun's variables in this proc's environment."""
        self._setup_env(master_addr, master_port, run_id)

    def _for_run(self, master_addr: str, master_port: int, run_id: str) -> None:
        """Set the variables for run ``run_id`` unless this proc has them already."""
        if self.point is None or os.environ.get("TORCHELASTIC_RUN_ID") != run_id:
            self._setup_env(master_addr, master_port, run_id)

    def _setup_env(self, master_addr: str, master_port: int, run_id: str) -> None:
        self.point = current_rank()
        os.environ.update(
            elastic_env(self.point, master_addr, master_port, run_id or uuid.uuid4().hex)
        )

    @endpoint
    def main(
        self, master_addr: str, master_port: int, script_args: list[str], run_id: str = ""
    ) -> int:
        """Run a torchrun-style script here: ``["-m", "pkg.mod", *args]`` or
        ``["path.py", *args]``, as ``__main__`` with ``sys.argv`` set.

        Returns its exit code (0 when it returns; ``sys.exit(n)`` gives ``n``). An
        exception it raises fails this call with the script's traceback.
        """
        if not script_args or script_args == ["-m"]:
            raise ValueError("no script or module to run: give ['-m', 'module', ...] or [path]")
        self._for_run(master_addr, master_port, run_id)
        old_argv = sys.argv
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *script_args[2:]]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as e:
            code = e.code
            if code is None:
                return 0
            if isinstance(code, int):
                return code
            print(code, file=sys.stderr)
            return 1
        except BaseException:
            traceback.print_exc()  # in the rank's own log, as torchrun shows it
            raise
        finally:
            sys.argv = old_argv
            sys.stdout.flush()
            sys.stderr.flush()
        return 0

    @endpoint
    def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        master_addr: str,
        master_port: int,
        run_id: str,
    ) -> Any:
        """``fn(*args, **kwargs)`` here, with torchrun's environment set; its result.

        A default process group ``fn`` leaves behind is destroyed after it (aborted
        first where ``fn`` raised, so no other rank waits for this one; and
        Accelerate's process-wide state reset), as a torchrun process would end: the
        next launch on these procs starts afresh.
        """
        self._for_run(master_addr, master_port, run_id)
        failed = True
        try:
            result = fn(*args, **kwargs)
            failed = False
            return result
        except BaseException as e:
            traceback.print_exc()  # in the rank's own log, with its prefix
            # what the frames held (a DistributedDataParallel holding the process group
            # open) goes now, not when the error has been sent: the group's connections
            # close below, and the other ranks' collectives fail instead of waiting
            traceback.clear_frames(e.__traceback__)
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                _end_process_group(abort=failed)
            except Exception as e:  # fn's own error (or result) is what the caller hears
                print(f"danaus: ending the process group failed: {e!r}", file=sys.stderr)


def _end_process_group(abort: bool) -> None:
    """Destroy the default process group ``fn`` left. After a failure, abort it first:
    its connections close even where a ``DistributedDataParallel`` still holds it, so
    the other ranks' collectives fail at once instead of waiting for this rank."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if abort:
            import gc

            gc.collect()  # (cycles through what fn built, its process group among them)
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()
        if dist.is_initialized():
            dist.destroy_process_group()
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)  # noqa: SLF001
