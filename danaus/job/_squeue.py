"""SLURM's client commands, run with a bound, and what they say of a job."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from ._hostlist import expand_hostlist

__all__ = ["COMMAND_TIMEOUT", "TERMINAL", "job_status", "slurm_command"]

#: SLURM job states after which the job holds no nodes.
TERMINAL = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
#: How long a slurm command may take before it counts as failed (s).
COMMAND_TIMEOUT = 60.0


def slurm_command(
    args: Sequence[str], input: str | None = None, *, who: str = "SlurmJob needs"
) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command, bounded by ``COMMAND_TIMEOUT``; a missing one is a
    ``RuntimeError`` saying what needs it (``who``)."""
    try:
        return subprocess.run(
            list(args), input=input, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
        )
    except FileNotFoundError:
        raise RuntimeError(
            f"{args[0]} is not installed here: {who} SLURM's client commands"
        ) from None


def job_status(job_id: str) -> tuple[str, list[str]] | None:
    """``(state, nodes)`` of a SLURM job (a step id ``J.S`` asks about job ``J``);
    None once SLURM has forgotten it."""
    out = slurm_command(["squeue", "-h", "-t", "all", "-j", job_id.split(".")[0], "-o", "%T|%N"])
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return None
        raise RuntimeError(f"squeue -j {job_id} failed: {out.stderr.strip()}")
    line = out.stdout.strip().splitlines()[:1]
    if not line:
        return None
    state, _, nodes = line[0].partition("|")
    return state, (expand_hostlist(nodes) if nodes and nodes != "(null)" else [])
