"""The host agent of a scheduled job: ``python -m danaus.job._agent --dir JOBDIR``.

The scheduler starts one per node (``srun`` in the batch script). It runs a danaus host
agent on the node's own address (a free port unless ``--port`` is given), writes that
address to ``JOBDIR/agents/<node index>`` (the job directory is on a file system the
controller shares) and serves until SIGTERM (``scancel``) or until no controller has
held the job for a while (the ``JobLease`` actor installed here, see ``_lease``).

The agent's procs go with it (the host agent kills them), so ending the agent ends the
job's processes on this node, and once every node's agent is gone the job step ends.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import socket
import subprocess
import sys
from concurrent.futures import Future as ThreadFuture
from typing import Any

from ..actors.seam import all_runtimes, ensure_actor, new_event_loop
from ..config import config
from ..mesh.seam import read_key_file, serve
from ._lease import AGENTS_DIR, LEASE, JobLease

log = logging.getLogger("danaus.job.agent")


def node_identity() -> tuple[str, int, str]:
    """``(node name, node index in the job, step id)`` from SLURM's task environment."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    index = os.environ.get("SLURM_NODEID") or os.environ.get("SLURM_PROCID")
    if index is None:
        raise SystemExit("danaus job agent: SLURM_NODEID is unset: start it with srun")
    return node, int(index), os.environ.get("SLURM_STEP_ID", "")


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _slurm_node_addr(node: str) -> str | None:
    """The node's ``NodeAddr``: the address SLURM itself reaches the node at."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", node],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return _resolve(field.removeprefix("NodeAddr="))
    return None


def bind_host(node: str) -> str:
    """The node's own address: its SLURM node name resolved, unless that gives a
    loopback address (Debian maps a host's own name to 127.0.1.1): then SLURM's
    ``NodeAddr`` for it, which other nodes reach it at."""
    addr = _resolve(node)
    if addr is not None and not ipaddress.ip_address(addr).is_loopback:
        return addr
    addr = _slurm_node_addr(node) or addr or _resolve(socket.gethostname())
    if addr is None:
        raise SystemExit(f"danaus job agent: cannot find this node's address ({node!r})")
    return addr


def write_address(job_dir: str, index: int, line: str) -> None:
    """Publish this agent's address atomically: the controller never reads half a line."""
    folder = os.path.join(job_dir, AGENTS_DIR)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{index}.tmp")
    with open(tmp, "w") as f:
        f.write(line + "\n")
    os.replace(tmp, os.path.join(folder, str(index)))


async def run(job_dir: str, port: int, idle_timeout: float | None) -> None:
    node, index, step = node_identity()
    key = read_key_file(os.path.join(job_dir, "key"))
    ready: ThreadFuture[str] = ThreadFuture()
    listen = f"tcp://{bind_host(node)}:{port}"
    loop = asyncio.get_running_loop()
    agent: asyncio.Future[Any] = asyncio.ensure_future(serve(listen, key, ready))
    listening: asyncio.Future[Any] = asyncio.wrap_future(ready)
    await asyncio.wait([agent, listening], return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        listening.cancel()
        await agent  # it failed before listening: its error
        return
    addr = ready.result()
    rt = next(r for r in all_runtimes() if r.loop is loop)
    ensure_actor(rt, LEASE, lambda: JobLease(node, addr, idle_timeout))
    write_address(job_dir, index, f"{addr} {node} {os.getpid()} {step}")
    await agent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m danaus.job._agent")
    parser.add_argument("--dir", required=True, help="the job directory (shared file system)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any)")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="end the job when no controller has held it this long (s; default: never)",
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=config.log_level,
        format="[job agent %(name)s] %(levelname)s %(message)s",
    )
    loop = new_event_loop()
    try:
        loop.run_until_complete(run(ns.dir, ns.port, ns.idle_timeout))
    finally:
        loop.close()


if __name__ == "__main__":
    main(sys.argv[1:])
