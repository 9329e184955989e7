"""The spawner's side of the debugger: the sessions of actors paused in pdb, and what
``danaus debug`` (through the admin endpoint, ``danaus/mesh/_debugging/sessions.py``) or a
notebook does with them.

An actor that hits ``breakpoint()`` (or raises, with ``config.debug_on_error``) opens a
session to its spawner (see :mod:`danaus.actors._debugging.remote_pdb`). In the controller each
session joins :data:`registry`: its output is kept, numbered, for readers that poll with
a cursor (``debug.read``, a long poll), and lines typed go back to it (``debug.send``).
In a proc (an actor that spawned a mesh of its own) sessions are relayed to that proc's
own parent instead (:mod:`danaus.actors._debugging.relay`), so they all reach the controller.

Whoever types into a session holds it while it keeps polling; a holder silent for
:data:`HOLD` seconds (its terminal closed, its process killed) lets go, and the sessions it
held continue, as pdb's ``continue``, rather than wait for a person who is gone.
Sessions nobody has touched yet wait to be attached (a person may take a while to come).

Programs and notebooks can ask too, Monarch's way: ``debug_controller()`` is a singleton
actor in the controller (``get_or_spawn_controller``) that lists the sessions and waits
for one (``list``, ``wait_pending_session``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import threading
import time
from typing import TYPE_CHECKING, TypedDict

from .._connection import Connection
from .._loops import run_on
from .._wire import DebugDetach, DebugInput, DebugOpen, DebugOutput

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = [
    "HOLD",
    "DebugRegistry",
    "DebugSession",
    "registry",
    "unexcuse",
]

log = logging.getLogger("danaus.debug")

#: A holder of sessions that has not polled for this long is gone (s).
HOLD = 5.0
#: Output entries kept, all sessions together (a reader further behind is told so).
KEEP = 20_000
#: Output of one session kept since its last input (what ``attach`` shows again).
BACKLOG = 64 << 10
#: Longest a ``debug.read`` waits for something new (s).
MAX_WAIT = 10.0


class SessionState(enum.Enum):
    RUNNING = "running"  # between prompts (stepping through code)
    WAITING = "waiting"  # at a prompt, for a line
    CLOSED = "closed"  # the actor goes on


class DebugRecord(TypedDict):
    """An actor paused in pdb, as tools see it (``debug_sessions()``, the snapshot)."""

    id: int
    mesh: str
    rank: int
    coords: dict[str, int]
    actor: str
    proc: str
    host: str
    pid: int
    #: ``file:line``, and the function there
    where: str
    function: str
    #: "breakpoint", or "post-mortem: <exception>"
    reason: str
    state: str
    prompts: int
    #: when it stopped (``time.time()``)
    opened: float
    #: whether a ``danaus debug`` client is typing into it
    held: bool


@dataclasses.dataclass
class DebugSession:
    """One paused actor, as its spawner sees it."""

    id: int  # small, for people: "attach 3"
    conn: Connection
    wire: int  # the session's number on its channel
    info: DebugOpen
    where: str
    function: str
    opened: float  # time.time()
    state: SessionState = SessionState.RUNNING
    prompts: int = 0
    holder: str = ""  # the client typing into it ("" none)
    backlog: list[str] = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:
        return f"<DebugSession {self.id} {self.info.actor_id} {self.state.value} at {self.where}>"

    def record(self) -> DebugRecord:
        i = self.info
        return {
            "id": self.id,
            "mesh": i.mesh,
            "rank": i.rank,
            "coords": dict(i.coords),
            "actor": i.actor_id,
            "proc": i.proc,
            "host": i.host,
            "pid": i.pid,
            "where": self.where,
            "function": self.function,
            "reason": i.reason,
            "state": self.state.value,
            "prompts": self.prompts,
            "opened": self.opened,
            "held": bool(self.holder),
        }


class DebugRegistry:
    """The open sessions of this process (the controller), from whatever loop their
    channels arrive on; read and driven from any thread or loop. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[int, DebugSession] = {}
        self._by_wire: dict[tuple[Connection, int], DebugSession] = {}
        self._ids = 0
        #: output of every session, numbered: (seq, session id, kind, text); kind is
        #: "open", "out", "prompt" or "close"
        self._log: collections.deque[tuple[int, int, str, str]] = collections.deque(maxlen=KEEP)
        self._seq = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: holders and when each last polled (time.monotonic())
        self._holders: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<DebugRegistry sessions={len(self._sessions)} seq={self._seq}>"

    # ------------------------------------------------------------ from the channels

    def opened(self, conn: Connection, msg: DebugOpen) -> None:
        with self._lock:
            if (conn, msg.session) in self._by_wire:
                return
            self._ids += 1
            s = DebugSession(
                self._ids, conn, msg.session, msg, msg.where, msg.function, time.time()
            )
            self._sessions[s.id] = s
            self._by_wire[(conn, msg.session)] = s
            self._add(s.id, "open", msg.reason)
        log.warning(
            "%s (mesh %s, rank %d) is paused in pdb at %s (%s): attach with `danaus debug`",
            msg.actor_id,
            msg.mesh,
            msg.rank,
            msg.where,
            msg.reason,
        )

    def output(self, conn: Connection, msg: DebugOutput) -> None:
        with self._lock:
            s = self._by_wire.get((conn, msg.session))
            if s is None:
                return
            if msg.text:
                s.backlog.append(msg.text)
                if sum(len(t) for t in s.backlog) > BACKLOG:
                    s.backlog[:] = ["".join(s.backlog)[-BACKLOG:]]
                self._add(s.id, "out", msg.text)
            if msg.prompt:
                s.state = SessionState.WAITING
                s.prompts += 1
                if msg.where:
                    s.where, s.function = msg.where, msg.function
                self._add(s.id, "prompt", "")

    def closed(self, conn: Connection, wire: int) -> None:
        with self._lock:
            s = self._by_wire.pop((conn, wire), None)
            if s is not None:
                self._close(s)

    def lost(self, rt: Runtime, peer: str) -> None:
        """The connection from ``peer`` (on ``rt``'s loop) is gone: its sessions are over."""
        with self._lock:
            gone = [s for (conn, _), s in self._by_wire.items() if conn.peer == peer]
            for s in gone:
                del self._by_wire[(s.conn, s.wire)]
                self._close(s)
        for s in gone:
            unexcuse(rt, s.info.proc)

    def _close(self, s: DebugSession) -> None:
        s.state = SessionState.CLOSED
        self._sessions.pop(s.id, None)
        self._add(s.id, "close", "")

    def _add(self, sid: int, kind: str, text: str) -> None:
        """Log one entry (under the lock) and wake the readers."""
        self._seq += 1
        self._log.append((self._seq, sid, kind, text))
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:
                pass  # that reader's loop closed

    # ------------------------------------------------------------ for tools

    def sessions(self) -> list[DebugSession]:
        with self._lock:
            return sorted(self._sessions.values(), key=lambda s: s.id)

    def cursor(self) -> int:
        return self._seq

    async def read(
        self, cursor: int, holder: str = "", wait: float = 1.0
    ) -> tuple[int, list[tuple[int, int, str, str]], bool]:
        """``(new cursor, entries after cursor, some were dropped)``, waiting up to
        ``wait`` s for the first. A ``holder`` polling keeps its sessions held."""
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if holder:
                    self._holders[holder] = time.monotonic()
                if self._seq > cursor or time.monotonic() >= deadline:
                    entries = [e for e in self._log if e[0] > cursor]
                    dropped = bool(self._log) and self._log[0][0] > cursor + 1
                    return self._seq, entries, dropped
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            try:
                await asyncio.wait_for(fut, deadline - time.monotonic())
            except TimeoutError:
                pass

    def attach(self, sid: int, holder: str) -> tuple[DebugSession, str, int]:
        """Hold session ``sid``: ``(session, its output since its last input, cursor)``."""
        with self._lock:
            s = self._get(sid)
            if holder:
                s.holder = holder
                self._holders[holder] = time.monotonic()
            return s, "".join(s.backlog), self._seq

    def send(self, sids: list[int], line: str, holder: str = "") -> list[int]:
        """Type ``line`` into each session (a pdb command); they become ``holder``'s."""
        if "\n" in line:
            raise ValueError("one line at a time")
        with self._lock:
            targets = [self._get(sid) for sid in sids]
            for s in targets:
                s.backlog.clear()
                s.state = SessionState.RUNNING
                if holder:
                    s.holder = holder
            if holder:
                self._holders[holder] = time.monotonic()
        for s in targets:
            run_on(s.conn.rt, s.conn.send, DebugInput(s.wire, line))
        return [s.id for s in targets]

    def detach(self, sids: list[int] | None = None) -> list[int]:
        """Let sessions go (all when ``sids`` is None): each clears its breakpoints and
        continues."""
        with self._lock:
            if sids is None:
                targets = list(self._sessions.values())
            else:
                targets = [self._get(sid) for sid in sids]
        for s in targets:
            run_on(s.conn.rt, s.conn.send, DebugDetach(s.wire))
        return [s.id for s in targets]

    def release(self, holder: str) -> None:
        """``holder`` leaves (quit): its sessions stay paused, held by nobody."""
        with self._lock:
            self._holders.pop(holder, None)
            for s in self._sessions.values():
                if s.holder == holder:
                    s.holder = ""

    def sweep(self) -> None:
        """Holders that stopped polling are gone: their sessions continue."""
        if not self._holders:
            return
        now = time.monotonic()
        with self._lock:
            gone = {h for h, seen in self._holders.items() if now - seen > HOLD}
            if not gone:
                return
            for h in gone:
                del self._holders[h]
            orphans = [s.id for s in self._sessions.values() if s.holder in gone]
            for sid in orphans:
                self._sessions[sid].holder = ""
        if orphans:
            log.warning(
                "the debugger attached to session(s) %s stopped answering: they continue",
                orphans,
            )
            self.detach(orphans)

    def _get(self, sid: int) -> DebugSession:
        s = self._sessions.get(sid)
        if s is None:
            raise LookupError(f"no open debugger session {sid}")
        return s


def unexcuse(rt: Runtime, proc: str) -> None:
    """A session's channel broke without its end: its proc may be frozen (stopped while
    paused). If it said its loop is paused, its silence counts again from now."""
    conn = rt.open_connection(proc)
    if conn is not None and conn.peer_paused:
        conn.set_peer_paused(False)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


#: this process's sessions (the controller's)
registry = DebugRegistry()
