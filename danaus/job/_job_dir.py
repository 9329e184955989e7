"""A SLURM job's directory, on a file system the nodes share with the controller: the job
key the controller writes for the agents (mode 0600), the addresses the agents write back
once they listen, and the job's output; and the controller's wait for every agent.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

from ..actors.seam import actor_process
from ..config import config
from ._lease import AGENTS_DIR
from ._squeue import TERMINAL, job_status

__all__ = ["Agent", "create_job_dir", "output_tail", "wait_for_agents"]

#: How often the job's state and the agents' addresses are polled while waiting (s).
POLL_INTERVAL = 0.02


class Agent(NamedTuple):
    """One node's host agent, as it reported itself."""

    addr: str
    node: str
    pid: int
    step: str  # its SLURM step, in a given allocation ("" in a batch job)


def create_job_dir(log_dir: str, job_name: str) -> str:
    """A new directory under ``log_dir`` (mode 0700) holding the job key (mode 0600)."""
    job_dir = os.path.join(log_dir, f"{job_name}-{uuid.uuid4().hex[:12]}")
    os.makedirs(job_dir, mode=0o700)
    fd = os.open(os.path.join(job_dir, "key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(actor_process.job_key().hex() + "\n")
    return job_dir


def output_tail(job_dir: str | None, lines: int = 10) -> str:
    """The last ``lines`` of each SLURM output file in ``job_dir``."""
    if job_dir is None:
        return ""
    text = []
    for name in sorted(os.listdir(job_dir)):
        if name.startswith("slurm-") and name.endswith(".out"):
            with open(os.path.join(job_dir, name), errors="replace") as f:
                text += f.read().splitlines()[-lines:]
    return "\n".join(text)


def _ended(slurm_job_id: str, job_dir: str, status: tuple[str, list[str]] | None) -> RuntimeError:
    state = status[0] if status else "gone from the queue"
    tail = output_tail(job_dir)
    return RuntimeError(
        f"SLURM job {slurm_job_id} ended ({state}) before its agents reported"
        + (f"; its output:\n{tail}" if tail else "")
    )


def wait_for_agents(
    job_dir: str,
    nodes: int,
    slurm_job_id: str,
    *,
    srun: subprocess.Popen[bytes] | None,
    start_timeout: float | None,
    cancel: Callable[[], None],
) -> list[Agent]:
    """Each agent of the job, in node order, once all ``nodes`` reported.

    Raises ``RuntimeError`` when the job (or ``srun``, for a step of a given allocation)
    ends first, and ``TimeoutError`` when it stays queued past ``start_timeout`` (after
    calling ``cancel``) or its agents do not all report within
    ``config.proc_start_timeout`` of it running.
    """
    folder = os.path.join(job_dir, AGENTS_DIR)
    queued_until = None if start_timeout is None else time.monotonic() + start_timeout
    started: float | None = None
    next_check = 0.0
    while True:
        now = time.monotonic()
        names = os.listdir(folder) if os.path.isdir(folder) else []
        found = [n for n in names if n.isdigit()]
        if len(found) >= nodes:
            break
        if srun is not None and srun.poll() is not None:
            raise _ended(slurm_job_id, job_dir, ("srun exited", []))
        if now >= next_check:
            next_check = now + 0.2
            status = job_status(slurm_job_id)
            if status is None or status[0] in TERMINAL:
                raise _ended(slurm_job_id, job_dir, status)
            if status[0] == "RUNNING" and started is None:
                started = now
            elif status[0] != "RUNNING" and queued_until is not None and now > queued_until:
                cancel()
                raise TimeoutError(
                    f"SLURM job {slurm_job_id} did not start within "
                    f"{start_timeout} s (it is {status[0]}); cancelled it"
                )
        if started is not None and now - started > config.proc_start_timeout:
            raise TimeoutError(
                f"the agents of SLURM job {slurm_job_id} did not all report within "
                f"{config.proc_start_timeout} s (config.proc_start_timeout): "
                f"{len(found)} of {nodes} in {folder}\n{output_tail(job_dir)}"
            )
        time.sleep(POLL_INTERVAL)
    agents = []
    for i in range(nodes):
        with open(os.path.join(folder, str(i))) as f:
            addr, node, pid, *step = f.read().split()
        agents.append(Agent(addr, node, int(pid), step[0] if step else ""))
    return agents
