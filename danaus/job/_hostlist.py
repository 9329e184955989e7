"""SLURM's host lists: ``expand_hostlist("gpu[01-03,07]")``, as ``squeue`` and
``scontrol`` print a job's nodes. SLURM jobs themselves are :class:`danaus.job.SlurmJob`
(``_slurm.py``, Monarch's ``monarch.job`` shape)."""

from __future__ import annotations

import re

__all__ = ["expand_hostlist"]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm host list: ``"gpu[01-03,07],cpu5"`` -> ``gpu01 gpu02 gpu03 gpu07 cpu5``."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", item)
        if m is None:
            if item:
                hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {part!r} in host list {hostlist!r}")
            width = len(lo)
            hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return hosts
