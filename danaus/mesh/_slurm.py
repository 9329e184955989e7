"""SLURM helpers: ``expand_hostlist``, and ``SlurmJob``, the ``srun`` command of one host
agent per node at a fixed port, for scripts that start the agents their own way.

For host meshes on SLURM, use :class:`danaus.job.SlurmJob` (Monarch's ``monarch.job``
shape: ``sbatch``, agents on free ports, the job ended with its controller); this one
stays for code written against it.

Inside an allocation (``salloc`` or an ``sbatch`` script), the controller runs::

    job = SlurmJob(port=26600, key_file="~/.danaus-key")
    job.launch()                      # srun: one host agent per node, in the background
    hosts = job.attach()              # attach_to_hosts(job.addresses())
    procs = hosts.spawn_procs(per_host={"gpus": 8})

``job.srun_command()`` is the command itself, for scripts that start the agents their
own way.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._host_mesh import HostMesh

__all__ = ["SlurmJob", "expand_hostlist"]


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


@dataclass
class SlurmJob:
    """One danaus host agent per node of a Slurm allocation.

    Attributes:
        port: the TCP port each agent listens on.
        key_file: file with the job key as hex (``danaus new-key > FILE``), readable on
            every node (a shared home directory). Defaults to ``$DANAUS_AUTH_KEY``.
        nodes: how many nodes to use (default: all of the allocation).
        nodelist: the allocation's nodes (default: ``$SLURM_JOB_NODELIST``).
        python: the interpreter on the nodes (default: this one).
        srun_args: extra ``srun`` arguments, e.g. ``["--partition=gpu", "--time=1:00:00"]``.
        env: extra environment for the agents.
    """

    port: int = 26600
    key_file: str | None = None
    nodes: int | None = None
    nodelist: str | None = None
    python: str = field(default_factory=lambda: sys.executable)
    srun_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    job_name: str = "danaus-agents"

    def hosts(self) -> list[str]:
        """The node names the agents run on."""
        nodelist = self.nodelist or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise RuntimeError(
                "no Slurm allocation: set nodelist= or run inside salloc/sbatch "
                "(SLURM_JOB_NODELIST is unset)"
            )
        hosts = expand_hostlist(nodelist)
        if self.nodes is not None:
            if self.nodes > len(hosts):
                raise ValueError(f"asked for {self.nodes} nodes, the allocation has {len(hosts)}")
            hosts = hosts[: self.nodes]
        return hosts

    def agent_command(self) -> str:
        """The shell command each Slurm task runs (``$(hostname)`` expands on its node)."""
        cmd = [self.python, "-m", "danaus", "host-agent"]
        listen = f"--listen tcp://$(hostname):{self.port}"
        key = (
            f" --key-file {shlex.quote(os.path.expanduser(self.key_file))}" if self.key_file else ""
        )
        return f"exec {shlex.join(cmd)} {listen}{key}"

    def srun_command(self) -> list[str]:
        """``srun`` starting one agent per node: exactly one task on each."""
        hosts = self.hosts()
        args = [
            "srun",
            f"--nodes={len(hosts)}",
            "--ntasks-per-node=1",
            f"--ntasks={len(hosts)}",
            f"--nodelist={','.join(hosts)}",
            f"--job-name={self.job_name}",
            "--kill-on-bad-exit=1",
            *self.srun_args,
        ]
        if self.env:
            exports = ",".join(["ALL", *(f"{k}={v}" for k, v in self.env.items())])
            args.append(f"--export={exports}")
        return [*args, "bash", "-c", self.agent_command()]

    def addresses(self) -> list[str]:
        """``tcp://node:port`` of each agent, in node order (the ``hosts`` dim)."""
        return [f"tcp://{h}:{self.port}" for h in self.hosts()]

    def launch(self) -> subprocess.Popen[bytes]:
        """Run ``srun_command()`` in the background; stop it with ``.terminate()``."""
        return subprocess.Popen(self.srun_command())

    def attach(self) -> HostMesh:
        """``attach_to_hosts(self.addresses())`` with this job's key."""
        from ._host_mesh import attach_to_hosts

        return attach_to_hosts(self.addresses(), key_file=self.key_file)
