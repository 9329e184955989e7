"""SLURM jobs by server handle: Monarch's ``info``, ``server_ready``, ``kill`` and
``kill_and_confirm`` (``monarch.tools.commands``), served without TorchX.

A server handle is ``scheduler://namespace/app_id``; danaus serves the ``slurm``
scheduler, whose app id is the SLURM job id (``slurm:///1234``) or, as Monarch's
``get_or_create`` names its servers, the job's name (``slurm:///trainers``)::

    spec = await server_ready("slurm:///1234", check_interval=timedelta(seconds=1))
    if spec is not None and spec.is_running:
        print(spec.host0(spec.get_mesh_names()[0]))
    kill_and_confirm("slurm:///1234", timeout_after_kill=60)

Everything comes from ``squeue``: this cluster keeps no accounting, so a job SLURM has
forgotten (``MinJobAge`` after it ended) is not found (``None``), as Monarch's ``info``
says of jobs that exited long ago. ``SlurmJob`` submits one batch job for all its meshes
and records in the job's comment how they share its nodes, in order, so such a job has
its meshes, each with its nodes; another plain job is one mesh, named after the job, with
all its nodes; a heterogeneous job is one mesh per component name.
"""

from __future__ import annotations

import asyncio
import enum
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ._hostlist import expand_hostlist
from ._squeue import COMMAND_TIMEOUT, slurm_command

__all__ = [
    "TIMEOUT_AFTER_KILL",
    "AppState",
    "MeshSpec",
    "ServerSpec",
    "info",
    "is_terminal",
    "kill",
    "kill_and_confirm",
    "server_ready",
]

#: How long ``kill_and_confirm`` waits for the job to end by default (s), as Monarch's.
TIMEOUT_AFTER_KILL = 300
#: The scheduler danaus serves handles of.
SCHEDULER = "slurm"

_UNSET_INT = -1
_UNSET_STR = "__UNSET__"
_DEFAULT_PORT = 26600  # Monarch's remote allocator port; danaus's agents choose their own
_HANDLE = re.compile(r"(?P<scheduler>.+)://(?P<namespace>.*)/(?P<app_id>.+)")
_JOB_ID = re.compile(r"\d+(_\d+)?")
#: squeue's fields, in this order: job id (``J+K`` in a heterogeneous job), state, node
#: list, node count, comment (where ``SlurmJob`` records its meshes:
#: ``danaus-meshes=trainers:2,loaders:1``), and last the name (which may hold a ``|``).
_FORMAT = "%i|%T|%N|%D|%k|%j"
#: Polls of ``kill_and_confirm``: the first, and the longest gap (s).
_FIRST_POLL = 0.1
_MAX_POLL = 2.0


class AppState(enum.IntEnum):
    """A server's state: TorchX's ``AppState`` names, in its order (earlier is less
    progressed), so ``state <= AppState.PENDING`` means "not running yet"."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name


def is_terminal(state: AppState) -> bool:
    """Whether a server in ``state`` has ended (TorchX's ``is_terminal``)."""
    return state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)


#: SLURM job state (``squeue %T``) -> AppState; any other is UNKNOWN.
SLURM_STATES: dict[str, AppState] = {
    "PENDING": AppState.PENDING,
    "CONFIGURING": AppState.PENDING,
    "REQUEUED": AppState.PENDING,
    "REQUEUE_FED": AppState.PENDING,
    "REQUEUE_HOLD": AppState.PENDING,
    "RESV_DEL_HOLD": AppState.PENDING,
    "RESIZING": AppState.PENDING,
    "SUSPENDED": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "COMPLETING": AppState.RUNNING,  # still holds nodes
    "COMPLETED": AppState.SUCCEEDED,
    "BOOT_FAIL": AppState.FAILED,
    "DEADLINE": AppState.FAILED,
    "FAILED": AppState.FAILED,
    "NODE_FAIL": AppState.FAILED,
    "OUT_OF_MEMORY": AppState.FAILED,
    "PREEMPTED": AppState.FAILED,
    "REVOKED": AppState.FAILED,
    "SPECIAL_EXIT": AppState.FAILED,
    "TIMEOUT": AppState.FAILED,
    "CANCELLED": AppState.CANCELLED,
}


@dataclass
class MeshSpec:
    """One mesh of a server, as ``info`` describes it (Monarch's ``MeshSpec`` fields).

    ``hostnames`` (in node order) are filled only while the mesh is RUNNING; SLURM does
    not say what ``host_type``, ``gpus`` and ``image`` were asked for, so they stay unset,
    and ``port`` is Monarch's default (danaus's agents each choose theirs).
    """

    name: str
    num_hosts: int
    host_type: str = _UNSET_STR
    gpus: int = _UNSET_INT
    transport: str = "tcp"
    port: int = _DEFAULT_PORT
    hostnames: list[str] = field(default_factory=list)
    state: AppState = AppState.UNSUBMITTED
    image: str = _UNSET_STR


@dataclass
class ServerSpec:
    """A server (a SLURM job) as ``info`` describes it (Monarch's ``ServerSpec``).

    ``name`` is the SLURM job id, so ``server_handle`` names this very job even when it
    was found by name; ``metadata["slurm/job_name"]`` is its name.
    """

    name: str
    state: AppState
    meshes: list[MeshSpec]
    scheduler: str
    namespace: str = ""
    ui_url: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def server_handle(self) -> str:
        """``scheduler://namespace/name``."""
        return f"{self.scheduler}://{self.namespace}/{self.name}"

    @property
    def is_running(self) -> bool:
        """Whether the server is RUNNING (only then are hostnames known)."""
        return self.state == AppState.RUNNING

    def host0(self, mesh_name: str) -> str:
        """The first host of mesh ``mesh_name`` (e.g. for ``MASTER_ADDR``).

        Raises:
            ValueError: the server has no such mesh.
            RuntimeError: the server is not RUNNING, or the mesh has no hosts.
        """
        mesh = self.get_mesh_spec(mesh_name)
        if self.is_running:
            if not mesh.hostnames:
                raise RuntimeError(f"{self.server_handle} has no hosts in mesh {mesh_name!r}")
            return mesh.hostnames[0]
        if self.state in (AppState.SUBMITTED, AppState.PENDING):
            raise RuntimeError(
                f"{self.server_handle} is {self.state}, so it has no hosts yet: "
                f"await server_ready({self.server_handle!r}) first"
            )
        if is_terminal(self.state):
            raise RuntimeError(f"{self.server_handle} has ended ({self.state}): it has no hosts")
        raise RuntimeError(f"{self.server_handle} is {self.state}: its hosts are not known")

    def get_mesh_spec(self, mesh_name: str) -> MeshSpec:
        """The mesh named ``mesh_name``; ValueError naming the others if none is."""
        for mesh in self.meshes:
            if mesh.name == mesh_name:
                return mesh
        raise ValueError(
            f"no mesh {mesh_name!r} in {self.server_handle}; its meshes: {self.get_mesh_names()}"
        )

    def get_mesh_names(self) -> list[str]:
        """The meshes' names, in order."""
        return [m.name for m in self.meshes]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary (Monarch's shape), e.g. for ``json.dumps``."""
        return {
            "name": self.name,
            "server_handle": self.server_handle,
            **({"ui_url": self.ui_url} if self.ui_url else {}),
            "state": self.state.name,
            "meshes": {
                m.name: {
                    "host_type": m.host_type,
                    "hosts": m.num_hosts,
                    "gpus": m.gpus,
                    "hostnames": m.hostnames,
                }
                for m in self.meshes
            },
        }


# ------------------------------------------------------------------ squeue


def _squeue_command(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command with a bound; errors name the command."""
    try:
        return slurm_command(args, who="danaus's slurm:/// server handles need")
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{' '.join(args)} did not answer within {COMMAND_TIMEOUT} s") from None


def _parse_handle(server_handle: str) -> tuple[str, str]:
    """``(namespace, app_id)`` of a ``slurm://namespace/app_id`` handle."""
    m = _HANDLE.fullmatch(server_handle)
    if m is None:
        raise ValueError(
            f"{server_handle!r} is not a server handle (scheduler://namespace/app_id); "
            "danaus serves slurm handles: slurm:///<job id or name>"
        )
    if m["scheduler"] != SCHEDULER:
        raise ValueError(
            f"{server_handle!r} is a {m['scheduler']!r} handle; danaus serves slurm "
            "handles only (slurm:///<job id or name>): its jobs do the other "
            "schedulers' work (docs/jobs.md)"
        )
    return m["namespace"], m["app_id"]


def _squeue_lines(args: list[str]) -> list[list[str]]:
    out = _squeue_command(["squeue", "-h", "-t", "all", *args, "-o", _FORMAT])
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return []
        raise RuntimeError(f"squeue {' '.join(args)} failed: {out.stderr.strip()}")
    return [line.split("|", 5) for line in out.stdout.splitlines() if line.count("|") >= 5]


_MESHES = re.compile(r"danaus-meshes=([A-Za-z_][A-Za-z0-9_]*:\d+(?:,[A-Za-z_][A-Za-z0-9_]*:\d+)*)")


def _job_id(app_id: str) -> str | None:
    """The SLURM job id that ``app_id`` names: itself, or the job of that name (the
    newest that has not ended, else the newest); None if there is none."""
    if _JOB_ID.fullmatch(app_id):
        return app_id
    lines = _squeue_lines(["-n", app_id])
    jobs = {
        line[0].split("+")[0]: SLURM_STATES.get(line[1], AppState.UNKNOWN)
        for line in lines
        if line[5] == app_id
    }
    if not jobs:
        return None
    return max(jobs, key=lambda j: (not is_terminal(jobs[j]), int(j.split("_")[0]), j))


def _hostnames(nodes: str) -> list[str]:
    return expand_hostlist(nodes) if nodes and nodes != "(null)" else []


def _danaus_meshes(line: list[str]) -> list[MeshSpec] | None:
    """The meshes a ``SlurmJob`` recorded in its job's comment, each with its share of
    the nodes, in order; None for a job that recorded none."""
    m = _MESHES.search(line[4])
    if m is None:
        return None
    state = SLURM_STATES.get(line[1], AppState.UNKNOWN)
    hosts = _hostnames(line[2]) if state == AppState.RUNNING else []
    meshes, first = [], 0
    for part in m.group(1).split(","):
        name, n = part.split(":")
        share = hosts[first : first + int(n)]
        meshes.append(MeshSpec(name=name, num_hosts=int(n), hostnames=share, state=state))
        first += int(n)
    return meshes


def _meshes(lines: list[list[str]]) -> list[MeshSpec]:
    """The meshes a ``SlurmJob`` recorded (one line), else one mesh per job name, in
    component order (a plain job: one line, one mesh)."""
    if len(lines) == 1:
        recorded = _danaus_meshes(lines[0])
        if recorded is not None:
            return recorded
    meshes: dict[str, MeshSpec] = {}
    for _, slurm_state, nodes, count, _, name in lines:
        state = SLURM_STATES.get(slurm_state, AppState.UNKNOWN)
        hosts = _hostnames(nodes) if state == AppState.RUNNING else []
        num = int(count) if count.isdigit() else len(hosts)
        mesh = meshes.get(name)
        if mesh is None:
            meshes[name] = MeshSpec(name=name, num_hosts=num, hostnames=hosts, state=state)
        else:  # the least progressed component's state, as Monarch's per-mesh state
            mesh.num_hosts += num
            mesh.hostnames += hosts
            mesh.state = min(mesh.state, state)
    return list(meshes.values())


def _component(line: list[str]) -> int:
    _, _, offset = line[0].partition("+")
    return int(offset) if offset.isdigit() else 0


# ------------------------------------------------------------------ Monarch's commands


def info(server_handle: str) -> ServerSpec | None:
    """The server's state and meshes, as ``squeue`` has them (Monarch's ``info``).

    Args:
        server_handle: ``slurm:///<job id>``, or ``slurm:///<job name>`` (the newest job
            of that name that has not ended, else the newest).

    Returns:
        None when SLURM does not know the job: it never existed, or it ended long
        enough ago (``MinJobAge``) to be forgotten. A job that ended recently is
        described, in its terminal state.

    Raises:
        ValueError: not a ``slurm`` handle.
        RuntimeError: ``squeue`` is missing or fails.
    """
    namespace, app_id = _parse_handle(server_handle)
    job_id = _job_id(app_id)
    if job_id is None:
        return None
    lines = _squeue_lines(["-j", job_id])
    if not lines:
        return None
    lines.sort(key=_component)
    leader = lines[0]
    return ServerSpec(
        name=job_id,
        state=SLURM_STATES.get(leader[1], AppState.UNKNOWN),
        meshes=_meshes(lines),
        scheduler=SCHEDULER,
        namespace=namespace,
        metadata={"slurm/job_name": leader[5]},
    )


async def server_ready(
    server_handle: str, check_interval: timedelta = timedelta(seconds=5)
) -> ServerSpec | None:
    """Wait until the server is RUNNING with every mesh's hosts, or has ended; its spec
    then (Monarch's ``server_ready``). None if SLURM does not know the job.

    It checks every ``check_interval``, saying on standard output what it waits for;
    the caller bounds the wait (``async with asyncio.timeout(...)``). ``squeue`` runs
    in a thread, off the event loop.
    """
    interval = check_interval.total_seconds()
    start = datetime.now()
    waited = False
    while True:
        spec = await asyncio.to_thread(info, server_handle)
        if spec is None or is_terminal(spec.state):
            break
        what, state = "the job", spec.state
        if spec.state == AppState.RUNNING:
            pending = [m for m in spec.meshes if m.state <= AppState.PENDING]
            if not pending:
                break
            what, state = f"mesh {pending[0].name!r}", pending[0].state
        print(
            f"{server_handle}: waiting for {what} to be RUNNING (it is {state}); "
            f"next check in {interval:g} s, waited {datetime.now() - start}",
            end="\r",
            flush=True,
        )
        waited = True
        await asyncio.sleep(interval)
    if waited:
        print(flush=True)  # end the progress line
    return spec


def kill(server_handle: str) -> None:
    """Cancel the server's job (``scancel``), without waiting for it to end (Monarch's
    ``kill``). A job SLURM does not know, or one that has ended, is left as it is.

    Raises:
        ValueError: not a ``slurm`` handle.
        RuntimeError: ``scancel`` refused a job that is still running.
    """
    _, app_id = _parse_handle(server_handle)
    job_id = _job_id(app_id)
    if job_id is None:
        return
    out = _squeue_command(["scancel", job_id])
    if out.returncode != 0:
        spec = info(f"{SCHEDULER}:///{job_id}")
        if spec is not None and not is_terminal(spec.state):
            raise RuntimeError(f"scancel {job_id} ({server_handle}) failed: {out.stderr.strip()}")


def kill_and_confirm(server_handle: str, timeout_after_kill: float = TIMEOUT_AFTER_KILL) -> None:
    """Cancel the server's job and wait until it has ended (Monarch's
    ``kill_and_confirm``): it leaves the queue or reaches a terminal state.

    Raises:
        ValueError: not a ``slurm`` handle.
        TimeoutError: it has not ended ``timeout_after_kill`` seconds after ``scancel``.
    """
    _, app_id = _parse_handle(server_handle)
    job_id = _job_id(app_id)
    if job_id is None:
        return
    handle = f"{SCHEDULER}:///{job_id}"  # the job found now, even if its name is reused
    kill(handle)
    deadline = time.monotonic() + timeout_after_kill
    pause = _FIRST_POLL
    while True:
        spec = info(handle)
        if spec is None or is_terminal(spec.state):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"{server_handle} (SLURM job {job_id}) did not end within "
                f"{timeout_after_kill} s of scancel (it is {spec.state})"
            )
        time.sleep(min(pause, left))
        pause = min(pause * 2, _MAX_POLL)
