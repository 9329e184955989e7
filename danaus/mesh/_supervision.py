"""Supervision: failures become events for the owner of the mesh that failed.

Every mesh has an owner: the actor that spawned it (from inside an endpoint or
``__init__``), or the controller. A proc that exits or is killed, a connection that is
lost (or a peer that stops answering heartbeats), an actor whose ``__init__`` raised,
and an endpoint that raised while nobody waited for its result (``broadcast``) each
become a :class:`MeshFailure` for that owner:

- an owner actor's ``__supervise__(failure)`` (sync or async) runs in its mailbox; a
  truthy return handles it. Otherwise the owner actor has failed too, and its own owner
  hears of that, and so on up.
- at the top, the controller's fault hook (:func:`set_unhandled_fault_hook`) gets it.
  The default hook logs the report at ERROR. It does not exit the controller (Monarch's
  does), because danaus is meant to live inside servers.

Either way the failed ranks are marked: calls to them fail at once with
``SupervisionError``, and slices without failed ranks keep working.

Procs that danaus stops itself (a mesh's ``stop``, the kill of every proc at interpreter
exit) are stopped, not failed: their exits, and what follows from them, are not reported.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from typing import NamedTuple, Protocol, TypedDict

from ..actors.seam import context
from ..errors import SupervisionError, actor_display_name, actor_failed
from ..geometry import Point, Shape
from ._process import process

__all__ = ["MeshFailure", "set_unhandled_fault_hook"]

log = logging.getLogger("danaus.supervision")


class StuckReport(NamedTuple):
    """An endpoint (or ``__init__``) of an actor this process spawned has been running for
    ``seconds``: what its proc said (or, for an ``__init__`` on the proc's loop, what the
    spawner saw), with the stack it was running."""

    actor_id: str
    mesh: str
    rank: str
    endpoint: str
    seconds: float
    stack: str


class FailureReport(TypedDict):
    """A failure as tools see it: when (``time.time()``), which mesh, which ranks (and
    their points), what kind (as :attr:`MeshFailure.kind`), and the report."""

    when: float
    mesh: str
    ranks: list[int]
    points: list[str]
    kind: str
    report: str


class _Named(Protocol):
    @property
    def actor_id(self) -> str: ...

    @property
    def display_name(self) -> str: ...


class _Stoppable(Protocol):
    def stop(self) -> Awaitable[object]: ...


class Owner(Protocol):
    """What supervision asks of a mesh's owner actor (the actor layer's instance)."""

    #: the meshes it spawned: they stop when it stops
    owned: list[_Stoppable]

    @property
    def stopped(self) -> bool: ...

    @property
    def ctx(self) -> _Named: ...

    def supervise(self, failure: MeshFailure, escalate_report: str) -> None:
        """Give ``failure`` to the actor's ``__supervise__``; unhandled, the actor fails
        with ``escalate_report``."""


class MeshFailure:
    """What failed, where, and how.

    Attributes:
        mesh: the failed mesh's name (an actor mesh, or a proc mesh with no actors).
        ranks: the failed ranks, as points of the mesh.
        report: a readable account: the remote traceback, the exit signal or code.
            Called, ``failure.report()`` is Monarch's report: "The actor <actor> and all
            its descendants have failed:" and the cause, indented (for a proc, "the
            process this actor was running on failed: Killed(sig=9) (...)").
        kind: ``"proc"`` (exited, killed, unreachable), ``"init"`` (``__init__`` raised),
            ``"actor"`` (an endpoint raised with no caller waiting), ``"unhandled"`` (an
            owner actor left a failure of its own meshes unhandled).
    """

    def __init__(
        self, mesh: str, ranks: Sequence[Point], report: str, kind: str, actor: str = ""
    ) -> None:
        self.mesh = mesh
        self.ranks = list(ranks)
        self.kind = kind
        #: how reports name the (first) failed actor: its class, mesh name and point
        self.actor = actor or mesh
        self.report = _Report(report)
        if kind == "unhandled":  # worded already, naming the child that failed first
            self.report.monarch = report
        else:
            cause = self.cause() + report.partition("\n")[2].join(("\n", "")).rstrip("\n")
            self.report.monarch = actor_failed(self.actor, cause)

    def cause(self) -> str:
        """The cause in one line, in Monarch's words where its users match on them."""
        first = self.report.strip().splitlines()[0] if self.report.strip() else self.kind
        if self.kind != "proc":
            return first
        killed = re.search(r"killed by (SIG\w+)", first)
        exited = re.search(r"exited with code (-?\d+)", first)
        if killed and killed.group(1) in signal.Signals.__members__:
            status = f"Killed(sig={signal.Signals[killed.group(1)].value})"
        elif exited:
            status = f"Stopped(exit={exited.group(1)})"
        else:
            status = "Failed"
        return f"the process this actor was running on failed: {status} ({first})"

    @property
    def mesh_name(self) -> str:
        """The failed mesh's name (Monarch's name for :attr:`mesh`)."""
        return self.mesh

    def __str__(self) -> str:
        # Monarch's form (its users match on "MeshFailure", the mesh name and
        # "crashed_ranks=[r]"), with the points and the kind besides.
        ranks = [r.rank for r in self.ranks]
        points = ", ".join(str(r) for r in self.ranks)
        return (
            f"MeshFailure(mesh_name={self.mesh}, crashed_ranks={ranks}, points=[{points}], "
            f"kind={self.kind}, event={self.report})"
        )

    def __repr__(self) -> str:
        return f"MeshFailure({self.mesh!r}, {[str(r) for r in self.ranks]}, kind={self.kind!r})"


class _Report(str):
    """The report text; called (Monarch's ``MeshFailure.report()``), Monarch's report."""

    monarch = ""

    def __call__(self) -> str:
        return self.monarch or str(self)


def exit_on_fault(failure: MeshFailure) -> None:
    """Monarch's default hook (the one ``python -m danaus.monarch`` installs): the failure
    is unhandled, so the controller ends: its main thread gets a ``KeyboardInterrupt``,
    which runs ``finally`` blocks and ``atexit`` hooks on its way out."""
    log.error("unhandled failure, exiting: %s", failure)
    sys.exit(1)


def interrupt_main() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread, as a Ctrl-C would: a real SIGINT
    to it where Python handles SIGINT and the thread does not block it (it then wakes
    from a sleep or a select). Where SIGINT is ignored (a controller started in the
    background or under ``nohup`` inherits that) or blocked, no signal would reach it:
    the exception is raised in the thread at its next bytecode instead (a wait it is
    blocked in ends first)."""
    main = threading.main_thread()
    if main.ident is None:
        return
    if callable(signal.getsignal(signal.SIGINT)) and not _blocks_sigint(main):
        signal.pthread_kill(main.ident, signal.SIGINT)
        return
    log.warning(
        "SIGINT is ignored or blocked in this controller's main thread: the "
        "KeyboardInterrupt is raised there at its next Python instruction"
    )
    _raise_in(main.ident, KeyboardInterrupt)


def _blocks_sigint(thread: threading.Thread) -> bool:
    """Whether ``thread`` blocks SIGINT (its signal mask, from /proc; False where that
    cannot be read)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/status") as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _raise_in(ident: int, exc: type[BaseException]) -> None:
    """Have thread ``ident`` raise ``exc`` at its next bytecode (CPython's
    ``PyThreadState_SetAsyncExc``)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))


def default_fault_hook(failure: MeshFailure) -> None:
    """What the controller does with a failure no actor handled, by default: log it at
    ERROR and keep running (Monarch's default exits)."""
    log.error("unhandled failure: %s", failure)


def interpreter_exiting() -> None:
    """From now on failures are marked but reach no owner and no hook: the interpreter is
    exiting, and danaus is stopping every proc itself (what follows from those kills,
    lost connections, spawns and calls that fail, is no failure to report)."""
    process.exiting.set()


def set_unhandled_fault_hook(
    fn: Callable[[MeshFailure], object] | None,
) -> Callable[[MeshFailure], object]:
    """Set what the controller does with failures no actor handled; returns the previous.

    ``None`` restores the default, which logs at ERROR (and keeps the controller running).
    The hook runs on the event loop that owns the mesh: it must not block. A hook that
    raises (``sys.exit(1)`` too) leaves the failure unhandled, as in Monarch: the main
    thread then gets a ``KeyboardInterrupt``.
    """
    with process.fault_hook_lock:
        old, process.fault_hook = process.fault_hook, fn
    return default_fault_hook if old is None else old


def _current_hook() -> Callable[[MeshFailure], object]:
    """The hook in force: ``danaus.unhandled_fault_hook`` when a program assigned it (as
    Monarch programs assign ``monarch.actor.unhandled_fault_hook``), else the one set with
    :func:`set_unhandled_fault_hook`."""
    top = sys.modules.get("danaus")
    assigned = getattr(top, "unhandled_fault_hook", None) if top is not None else None
    if assigned is not None and assigned is not default_fault_hook:
        return assigned  # type: ignore[no-any-return]
    hook = process.fault_hook  # (a hook may be falsy: an empty list-like recorder)
    return default_fault_hook if hook is None else hook


class MeshState:
    """Failure state of one mesh, shared by all its slices."""

    def __init__(
        self,
        name: str,
        shape: Shape,
        owner: Owner | None,
        ranks: frozenset[int] | None = None,
        proc_mesh: str = "",
        class_name: str = "",
    ) -> None:
        self.name = name
        #: the actors' class, qualified by its module ("": not an actor mesh, or unknown)
        self.class_name = class_name
        self.shape = shape  # of the whole mesh: global ranks index it
        self.owner = owner  # an ActorInstance, or None for the controller
        #: the name of the proc mesh its actors live on ("": not known here)
        self.proc_mesh = proc_mesh
        #: the global ranks this mesh has members at (an actor mesh on a slice: fewer)
        self.ranks = frozenset(shape.global_ranks()) if ranks is None else ranks
        self.failed: dict[int, str] = {}
        self.stopped: str | None = None

    def __repr__(self) -> str:
        return f"<MeshState {self.name} failed={sorted(self.failed)} stopped={self.stopped}>"

    def error_for(self, rank: int) -> SupervisionError | None:
        """The error a call to ``rank`` fails with at once, if it must."""
        if self.stopped is not None:
            return SupervisionError(f"mesh {self.name!r} was stopped ({self.stopped})")
        why = self.failed.get(rank)
        if why is not None:
            return SupervisionError(
                actor_failed(
                    self.display_name(rank),
                    f"mesh {self.name!r} rank {self.point(rank)} failed: {why}",
                )
            )
        return None

    def actor_id(self, rank: int) -> str:
        """The id of this mesh's actor at global ``rank``, as its proc names it."""
        if self.proc_mesh:
            return f"{self.proc_mesh}[{rank}].{self.name}[{rank}]"
        return f"{self.name}[{rank}]"

    def display_name(self, rank: int) -> str:
        """How failure reports name the actor at global ``rank`` (its class and point
        included, in Monarch's form; see :func:`danaus.errors.actor_display_name`)."""
        if not self.class_name:
            return self.actor_id(rank)
        proc = f"{self.proc_mesh}[{rank}]" if self.proc_mesh else "client"
        return actor_display_name(proc, self.class_name, self.name, self.point(rank))

    def point(self, rank: int) -> Point:
        return Point.from_rank(rank, self.shape.sizes)

    def fail(self, ranks: Sequence[int], report: str, kind: str) -> None:
        """Mark ``ranks`` failed and give the owner a :class:`MeshFailure` (once per rank)."""
        if self.stopped is not None:
            return
        new = [r for r in ranks if r not in self.failed]
        if not new:
            return
        summary = report.strip().splitlines()[0] if report.strip() else kind
        for r in new:
            self.failed[r] = summary
        failure = MeshFailure(
            self.name, [self.point(r) for r in new], report, kind, self.display_name(new[0])
        )
        process.failure_reports.append(
            {
                "when": time.time(),
                "mesh": self.name,
                "ranks": new,
                "points": [str(self.point(r)) for r in new],
                "kind": kind,
                "report": report,
            }
        )
        route(self.owner, failure)


def route(owner: Owner | None, failure: MeshFailure) -> None:
    """Give ``failure`` to ``owner`` (an ActorInstance) or, at the top, to the hook."""
    if process.exiting.is_set():
        log.debug("at exit, not reported: %s", failure)
        return
    if owner is None or owner.stopped:
        try:
            _current_hook()(failure)
        except BaseException as e:  # the hook's way to say "unhandled": sys.exit too
            log.error(
                "unhandled failure, and the fault hook raised %s: interrupting the main "
                "thread (KeyboardInterrupt): %s",
                type(e).__name__,
                failure,
            )
            interrupt_main()
        return
    owner.supervise(failure, unhandled_report(owner.ctx.display_name, failure))


def unhandled_report(owner: str, failure: MeshFailure) -> str:
    """Why ``owner`` fails when it leaves ``failure`` of a mesh it owns unhandled, in
    Monarch's words, which name the actor that failed first; the first line says it all
    (callers of the owner read that line), the whole failure follows."""
    return (
        f"The actor {owner} failed because it did not handle a supervision event from its "
        f"child; the event was: {actor_failed(failure.actor, failure.cause())}\n{failure}"
    )


def current_owner() -> Owner | None:
    """The ActorInstance whose endpoint is running now (None on the controller): the
    owner of any mesh spawned now."""
    ctx = context().actor
    return None if ctx is None else ctx.runtime_actor


def resolved() -> ThreadFuture[None]:
    """A thread-safe future that is already done."""
    f: ThreadFuture[None] = ThreadFuture()
    f.set_result(None)
    return f


def report_stuck(msg: StuckReport) -> None:
    """Keep a stuck report for the tools, and warn with its stack."""
    process.stuck_reports.append((time.time(), msg))
    what = "__init__" if msg.endpoint == "__init__" else f"endpoint {msg.endpoint}"
    log.warning(
        "%s of %s (mesh %s, rank %s) has been running for %.3g s; its stack:\n%s",
        what,
        msg.actor_id,
        msg.mesh,
        msg.rank,
        msg.seconds,
        msg.stack.rstrip(),
    )
