"""One picture of everything this controller runs, for people and their tools.

``snapshot()`` gathers, from every live proc mesh this process spawned: the procs (health,
pid, host, CPU, memory, bytes), the actor meshes on them (which ranks failed, why), every
actor's record (``mesh.stats()``), and the last failures and stuck-endpoint reports. It is
what ``danaus top``, the dashboard and the admin endpoint show; it is plain JSON-able data.

Each proc is asked on its own, with a bound: a dead or frozen proc is shown as such and
does not hold up the others.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Required, TypedDict

from ..._os import process_uptime
from ...actors.seam import ProcControl
from ...errors import ProtocolError
from ...geometry import Shape
from .._live_meshes import live_meshes
from .._process import process
from .records import ActorRecord, ProcReply, StackEntry, proc_reply, stack_entries

if TYPE_CHECKING:
    from ...actors.seam import DebugRecord
    from .._proc_group import ProcGroup
    from .._supervision import FailureReport

__all__ = [
    "ActorPicture",
    "ProcMeshPicture",
    "ProcPicture",
    "Snapshot",
    "proc_stacks",
    "snapshot",
]

#: a proc: ``failed`` (exited, killed, lost), ``unresponsive`` (no answer in time),
#: ``paused`` (no answer, with an actor in a debugger), ``ok``
ProcHealth = Literal["ok", "failed", "unresponsive", "paused"]
#: an actor: ``failed``, ``stopped``, ``paused`` (in a debugger), ``stuck`` (an endpoint
#: running longer than ``config.stuck_warn_after``), ``busy`` (one running), ``idle``
ActorHealth = Literal["failed", "stopped", "paused", "stuck", "busy", "idle"]


class ProcPicture(TypedDict, total=False):
    """One proc: where it is and its health; its record (``ProcRecord``'s keys) when it
    answered."""

    rank: Required[int]
    point: Required[str]
    addr: Required[str | None]
    health: Required[ProcHealth]
    failure: Required[str | None]
    error: Required[str | None]
    pid: Required[int | None]
    host: str
    cpu_percent: float
    rss_bytes: int
    connections: int
    bytes_in: int
    bytes_out: int
    actors: int
    threads: int


class ActorMeshPicture(TypedDict):
    """An actor mesh on a proc mesh: its ranks, which failed (why), whether stopped."""

    name: str
    ranks: list[int]
    failed: dict[str, str]
    stopped: str | None


class ProcMeshPicture(TypedDict):
    """A proc mesh: its procs and the actor meshes on them."""

    name: str
    sizes: dict[str, int]
    failed: dict[str, str]
    procs: list[ProcPicture]
    actor_meshes: list[ActorMeshPicture]


class PlacedActor(ActorRecord):
    """An actor's record and where it lives: its proc mesh and the proc's rank."""

    procs: str
    proc_rank: int


class ActorPicture(PlacedActor):
    """An actor's record, where it lives, and its health."""

    health: ActorHealth


class ControllerPicture(TypedDict):
    pid: int
    host: str
    argv: list[str]
    started: float


class StuckPicture(TypedDict):
    """A stuck-endpoint report and when it came (``time.time()``)."""

    when: float
    actor: str
    mesh: str
    rank: str
    endpoint: str
    seconds: float
    stack: str


class Snapshot(TypedDict):
    """What :func:`snapshot` gives (see the module's docstring)."""

    time: float
    controller: ControllerPicture
    proc_meshes: list[ProcMeshPicture]
    actors: list[ActorPicture]
    stuck: list[StuckPicture]
    failures: list[FailureReport]
    #: the actors paused in pdb
    debug: list[DebugRecord]
    #: what the layers above add (see :func:`add_section`): ``"trainers"``, the
    #: ``danaus.parallel`` trainers of this controller
    sections: dict[str, object]


#: how long one proc may take to answer a snapshot's question (s)
ASK_TIMEOUT = 5.0


def add_section(name: str, picture: Callable[[], object]) -> None:
    """Add ``picture()`` to every snapshot under ``sections[name]``: for the layers above
    the mesh (the trainers of ``danaus.parallel``) to show on the dashboard and in the
    admin endpoint's answers. ``picture`` runs on danaus's loop, must not block, and
    returns plain JSON-able data; where it raises, the section holds ``{"error": ...}``
    and the rest of the snapshot is unharmed."""
    process.snapshot_sections[name] = picture


def _sections() -> dict[str, object]:
    out: dict[str, object] = {}
    for name, picture in list(process.snapshot_sections.items()):
        try:
            out[name] = picture()
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _process_started() -> float:
    """When this process started (``time.time()``'s scale): this module is imported at the
    first snapshot, which may be long after. Now, where /proc does not say."""
    return time.time() - (process_uptime() or 0.0)


_STARTED = _process_started()


def _labelled() -> list[tuple[str, ProcGroup]]:
    """Each live proc mesh with the name tools know it by: its own, or ``name#2``, ... for
    later ones while an older mesh of the same name still runs (names need not be
    unique; a tool's question about one must reach that one)."""
    seen: dict[str, int] = {}
    out = []
    for group in live_meshes.groups():
        n = seen[group.name] = seen.get(group.name, 0) + 1
        out.append((group.name if n == 1 else f"{group.name}#{n}", group))
    return out


def _find(procs_name: str) -> ProcGroup:
    for label, group in _labelled():
        if label == procs_name:
            return group
    raise KeyError(f"no live proc mesh named {procs_name!r}")


async def _ask(
    addr: str | None,
    method: Literal["stats", "stacks"],
    *args: list[str] | None,
    answer_within: float = ASK_TIMEOUT,
) -> object:
    """Ask the control actor of the proc at ``addr``; the exception if it cannot answer."""
    from .._actor_mesh import mesh_ref

    if addr is None:  # failed (not asked: nothing listens), or not started yet
        return ConnectionError("no address to ask")
    ref = mesh_ref("__proc__", ProcControl, Shape.from_sizes({}), {0: addr})
    try:
        return await asyncio.wait_for(getattr(ref, method).call_one(*args), answer_within)
    except TimeoutError:
        return TimeoutError(f"no answer in {answer_within:g} s")
    except Exception as e:
        return e


async def _ask_stats(addr: str | None, answer_within: float) -> ProcReply | BaseException:
    """The stats of the proc at ``addr``; the exception if it cannot answer."""
    answer = await _ask(addr, "stats", None, answer_within=answer_within)
    if isinstance(answer, BaseException):
        return answer
    try:
        return proc_reply(answer, str(addr))
    except ProtocolError as e:
        return e


def _health(failure: str | None, answer: object, paused: bool) -> ProcHealth:
    if failure is not None:
        return "failed"
    if isinstance(answer, BaseException):
        return "paused" if paused else "unresponsive"
    return "ok"


#: how long a proc with an actor paused in a debugger may take to answer: its loop may be
#: the paused thread (an async endpoint), and then it cannot (s)
PAUSED_ASK_TIMEOUT = 0.5


async def _proc_mesh_picture(
    group: ProcGroup, label: str, debug: list[DebugRecord]
) -> tuple[ProcMeshPicture, list[PlacedActor]]:
    handles = group.handles
    points = list(group.shape.points())
    failed = group.failed_procs()
    paused = {d["proc"]: d for d in debug}
    answers = await asyncio.gather(
        *(
            _ask_stats(
                None if h.rank in failed else h.addr,
                PAUSED_ASK_TIMEOUT if h.addr in paused else ASK_TIMEOUT,
            )
            for h in handles
        )
    )
    procs: list[ProcPicture] = []
    actors: list[PlacedActor] = []
    for h, point, answer in zip(handles, points, answers, strict=True):
        failure = failed.get(h.rank)
        try:
            pid = h.pid
        except Exception:
            pid = None
        proc: ProcPicture = {
            "rank": h.rank,
            "point": str(point),
            "addr": h.addr,
            "health": _health(failure, answer, h.addr in paused),
            "failure": failure,
            "error": str(answer) if isinstance(answer, BaseException) and not failure else None,
            "pid": pid,
        }
        if not isinstance(answer, BaseException):
            proc = {**proc, **answer["proc"]}
            for record in answer["actors"].values():
                actors.append({**record, "procs": label, "proc_rank": h.rank})
        elif failure is None and h.addr in paused:  # its loop waits at the pdb prompt
            d = paused[h.addr]
            actors.append(
                {
                    "actor": d["actor"],
                    "mesh": d["mesh"],
                    "rank": d["rank"],
                    "procs": label,
                    "proc_rank": h.rank,
                    "handled": {},
                    "errors": {},
                    "last_failure": None,
                    "mailbox": 0,
                    "in_flight": 1,
                    "running": [(d["function"], time.time() - d["opened"])],
                    "failed": None,
                    "stopped": False,
                }
            )
        procs.append(proc)
    meshes: list[ActorMeshPicture] = [
        {
            "name": s.name,
            "ranks": sorted(s.ranks),
            "failed": {str(r): why for r, why in s.failed.items()},
            "stopped": s.stopped,
        }
        for s in group.states()
    ]
    picture: ProcMeshPicture = {
        "name": label,
        "sizes": dict(group.shape.sizes),
        "failed": {str(r): why for r, why in failed.items()},
        "procs": procs,
        "actor_meshes": meshes,
    }
    return picture, actors


def _actor_health(
    actor: PlacedActor, failed_meshes: dict[str, set[int]], stuck: float, paused: set[str]
) -> ActorHealth:
    if actor.get("failed") or actor["rank"] in failed_meshes.get(actor["mesh"], set()):
        return "failed"
    if actor.get("stopped"):
        return "stopped"
    if actor["actor"] in paused:  # in a debugger: not stuck, waiting for a person
        return "paused"
    long = set(actor.get("long_running", ()))  # (a shell's: as long as it serves)
    longest = max((s for m, s in actor["running"] if m not in long), default=0.0)
    if stuck > 0 and longest >= stuck:
        return "stuck"
    return "busy" if actor["in_flight"] else "idle"


async def snapshot() -> Snapshot:
    """Everything this controller runs, now (see the module's docstring)."""
    from ...config import config
    from .._debugging.sessions import debug_sessions

    debug = debug_sessions()
    pictures = await asyncio.gather(
        *(_proc_mesh_picture(g, label, debug) for label, g in _labelled())
    )
    placed: list[PlacedActor] = []
    failed_meshes: dict[str, set[int]] = {}
    for picture, those in pictures:
        placed.extend(those)
        for m in picture["actor_meshes"]:
            failed_meshes.setdefault(m["name"], set()).update(int(r) for r in m["failed"])
    stuck = config.stuck_warn_after
    paused = {s["actor"] for s in debug}
    actors: list[ActorPicture] = [
        {**a, "health": _actor_health(a, failed_meshes, stuck, paused)} for a in placed
    ]
    return {
        "time": time.time(),
        "controller": {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "argv": list(sys.argv),
            "started": _STARTED,
        },
        "proc_meshes": [p for p, _ in pictures],
        "actors": actors,
        "stuck": [
            {
                "when": when,
                "actor": s.actor_id,
                "mesh": s.mesh,
                "rank": s.rank,
                "endpoint": s.endpoint,
                "seconds": s.seconds,
                "stack": s.stack,
            }
            for when, s in list(process.stuck_reports)
        ],
        "failures": list(process.failure_reports),
        "debug": debug,
        "sections": _sections(),
    }


async def proc_stacks(procs: str, rank: int) -> list[StackEntry]:
    """The stacks of proc ``rank`` of the live proc mesh named ``procs``."""
    handles = {h.rank: h for h in _find(procs).handles}
    if rank not in handles:
        raise KeyError(f"proc mesh {procs!r} has no rank {rank}")
    addr = handles[rank].addr
    answer = await _ask(addr, "stacks")
    if isinstance(answer, BaseException):
        raise answer
    return stack_entries(answer, str(addr))
