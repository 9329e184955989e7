"""The runtime of one event loop: a listening address, connections, ports, local actors.

There is one :class:`Runtime` per event loop that uses danaus: in a proc, the proc's
loop; in the controller, the application's running loop (async code) or danaus's own
background loop (sync code). Messages to a peer go over one connection per peer
address, in the order sent. Its listening socket and dials are in
:mod:`~danaus.actors._sockets`, what it knows of peers in :mod:`~danaus.actors._peers`,
the owners of its ports in :mod:`~danaus.actors._replies_in`, messages held for actors
not spawned yet in :mod:`~danaus.actors._arrivals`, and casting to many actors down a
tree of procs in :mod:`~danaus.actors._cast`. It numbers every message it sends to an
actor (``next_seq``), and dispatches what arrives by the one handler table
(``_dispatch.py``). The layers above use it through its methods, never
its tables.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
from asyncio.events import _get_running_loop
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, TypeVarTuple

import msgspec

from ..config import config
from ..errors import AuthenticationError, ClosedError, ProtocolError, SupervisionError
from ._address import listen_address
from ._arrivals import ActorArrivals
from ._cast import send_tree
from ._connection import CLOSED, HANDSHAKE, OPEN, Connection
from ._errinfo import encode_error
from ._future import Future
from ._part_pool import trim_part_pool
from ._peers import fail_pending, fail_pending_after_exit, peer_lost_error, peers
from ._process import process
from ._replies_in import PortHandler, PortOwner, settle
from ._sockets import Listener, Via, dial
from ._wire import (
    CAST_GATHER,
    CAST_NONE,
    CAST_REDUCE,
    ERROR,
    Buffer,
    Call,
    CallSpec,
    Cancel,
    Creator,
    ErrorInfo,
    Message,
    Paused,
    Ping,
    Pong,
    Result,
    Spawn,
    StopActor,
    StopProc,
    frame,
)

if TYPE_CHECKING:
    from ._cast import GatherNode
    from ._dispatch import Dispatch
    from ._instance import ActorInstance
    from ._replies_out import ReplySink

log = logging.getLogger("danaus.runtime")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_PONG = Pong()


class LocalActor(Protocol):
    """What the runtime and the handlers ask of an actor living on this loop: an
    :class:`~danaus.actors._instance.ActorInstance`, or the stand-in for one whose
    ``__init__`` raised (``_handlers``), which fails every call with the reason."""

    def deliver(
        self, conn: ReplySink, msg: Call, parts: Sequence[Buffer], sender: str | None = None
    ) -> None: ...

    def skip(self, sender: str, seq: int) -> None: ...

    def cancel(self, conn: ReplySink, reply: int) -> None: ...

    async def stop(self) -> None: ...


class _Task(Protocol):
    """What the runtime does with a task it owns, whatever its result: cancel it."""

    def cancel(self) -> bool: ...


def on_every_heartbeat(check: Callable[[Runtime], None]) -> None:
    """Run ``check(runtime)`` on every heartbeat of every runtime, present and future."""
    from ._loops import all_runtimes

    process.heartbeat_checks.append(check)
    for rt in all_runtimes():
        rt.on_heartbeat.append(check)


def _dispatch_table() -> Mapping[type, Dispatch]:
    """The table every runtime dispatches by (``_dispatch.py``, which imports this module's
    handlers: so here, once a runtime is built, not at import)."""
    from ._dispatch import HANDLERS

    return HANDLERS


class Runtime:
    """Connections, ports and actors of one event loop. Use :func:`current_runtime`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        addr: str | None = None,
        key: bytes | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.loop = loop
        #: a key of this runtime's own; None: the process's job key, whatever it is when
        #: a connection is made (so that a key adopted later reaches every runtime)
        self._own_key = key
        # By default (config.transport "unix") a name nobody can predict: abstract socket
        # names are listed to every local process (/proc/net/unix), and one made of the
        # job id, the pid and a counter could be bound by another process before this
        # runtime binds it.
        self.addr = addr or listen_address(proc=False)
        self.conns: dict[str, Connection] = {}
        self.ports: dict[int, PortOwner] = {}
        self.actors: dict[str, LocalActor] = {}
        #: actors whose ``__init__`` runs now on their thread (not in ``actors`` yet)
        self.initializing: dict[str, ActorInstance] = {}
        self.closed = False
        #: a runtime on an application's own loop (made on first use, not by danaus)
        self.borrowed = False
        self.stop_requested: asyncio.Future[None] = loop.create_future()
        self._port_ids = itertools.count(1)
        #: peers whose connection was lost, and why: sends to them fail at once
        self.lost: dict[str, BaseException | None] = {}
        #: messages held for actors not spawned yet; actors known gone
        self.arrivals = ActorArrivals(self)
        #: cast tree nodes in this proc waiting for a subtree, by port (``_cast``'s)
        self.gathers: dict[int, GatherNode] = {}
        #: last sequence number sent, per proc address and actor (see ``next_seq``)
        self._seqs: dict[str, dict[str, int]] = {}
        #: held to number a message and put it on its connection, and by every write to
        #: a socket: other threads send some calls themselves (``send_call_from_thread``)
        self.send_lock = threading.RLock()
        #: what other threads handed to this loop that it has not run yet: while any is
        #: waiting, those threads write nothing themselves (it would overtake it)
        self._handed = 0
        #: the handler of each message type: the actor layer's one table
        self.handlers = _dispatch_table()
        self._tasks: set[_Task] = set()
        self._all_conns: set[Connection] = set()
        #: how peers not dialed directly are reached (``attach``'s gateway); None: all are
        self.via: Via | None = None
        self._listener = Listener(loop, self.addr, sock)
        self.addr = self._listener.addr
        self.on_lost: list[Callable[[str], None]] = []
        #: called on every heartbeat (layers above: the actor layer's stuck-endpoint check)
        self.on_heartbeat: list[Callable[[Runtime], None]] = list(process.heartbeat_checks)
        #: coroutines to run when the runtime closes (layers above: the RDMA manager)
        self.closers: list[Callable[[], Awaitable[object]]] = []
        self.spawn_task(self._listener.serve(self._accept))
        loop.call_later(config.heartbeat_interval, self._heartbeat)

    def __repr__(self) -> str:
        return f"<Runtime {self.addr} conns={len(self.conns)} actors={len(self.actors)}>"

    # ------------------------------------------------------------ setup

    def _heartbeat(self) -> None:
        """Ping quiet connections; drop those that stayed silent past the deadline.

        A proc that is alive at the socket level but frozen (SIGSTOP, a deadlock in C
        code) stops answering, and its callers' pending calls fail instead of hanging.
        A sync endpoint that blocks its proc's loop longer than ``heartbeat_timeout``
        looks the same: keep long work off the loop, or raise the timeout.
        """
        if self.closed:
            return
        trim_part_pool()
        now = self.loop.time()
        for conn in list(self.conns.values()):
            conn.heartbeat(now)
        for check in self.on_heartbeat:
            try:
                check(self)
            except Exception:
                log.exception("heartbeat check %r failed", check)
        self.loop.call_later(config.heartbeat_interval, self._heartbeat)

    def _accept(self) -> Connection:
        conn = Connection(self, dialer=False)
        self._all_conns.add(conn)
        return conn

    async def accept_socket(self, sock: socket.socket, *, tag_as_tcp: bool) -> None:
        """Serve ``sock``, a connected stream socket, as a connection a peer dialed (the
        other end of a connection relayed to this runtime, by ``attach``'s gateway);
        ``tag_as_tcp``: the peer dialed over TCP, so its frames carry session tags."""

        def accept() -> Connection:
            conn = self._accept()
            conn.tag_as_tcp = tag_as_tcp
            return conn

        await self.loop.connect_accepted_socket(accept, sock)

    def admit(self, conn: Connection) -> None:
        """Make room for this accepted, not yet authenticated connection. Strangers are
        bounded: past ``config.max_unauthenticated`` of them, the one that has waited
        longest is dropped, never the newcomer, which may be a peer of the job dialing
        for the first time (a stranger is cheap to drop, a peer is not; one that
        authenticates does so within moments)."""
        waiting = [
            c
            for c in self._all_conns
            if c.state is HANDSHAKE and not c.dialer and c is not conn and c.transport is not None
        ]
        if len(waiting) < config.max_unauthenticated:
            return
        oldest = min(waiting, key=lambda c: c.handshake_started)
        oldest.fail(
            AuthenticationError(
                f"dropped: {len(waiting)} connections waiting to authenticate "
                "(config.max_unauthenticated); this one waited longest"
            )
        )

    def stranger_closed(self, why: BaseException) -> None:
        """A connection that never authenticated was closed for ``why`` (counted and
        logged a line a second by the listener)."""
        self._listener.note_stranger(why)

    def spawn_task(
        self, coro: Coroutine[object, object, T], *, log_failure: bool = True
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a task owned by this runtime (cancelled at close).

        Its failure is logged, unless ``log_failure`` is False: then whoever takes the
        task's outcome reports it (an error is logged once, where nobody else gets it).
        """
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done if log_failure else self._tasks.discard)
        return task

    def _task_done(self, task: asyncio.Task[T]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("runtime task failed", exc_info=task.exception())

    def on_loop(self) -> bool:
        """True when called from this runtime's own loop."""
        return _get_running_loop() is self.loop

    # ------------------------------------------------------------ connections

    def connection(self, addr: str) -> Connection:
        """The connection to ``addr``, dialing it if there is none yet."""
        conn = self.conns.get(addr)
        if conn is not None and conn.state is not CLOSED:
            return conn
        if self.closed:
            raise ClosedError(f"runtime {self.addr} is closed")
        if addr in self.lost:
            return Connection.lost(self, addr, self.lost[addr])
        conn = self._dialer(addr)
        conn.dial_started = self.loop.time()
        self.conns[addr] = conn
        self._all_conns.add(conn)
        self.spawn_task(dial(self.loop, conn))
        return conn

    def redial(self, conn: Connection) -> bool:
        """``conn``, dialed by us, was reset before the peer said a word (a listener
        shedding strangers, a backlog overflowing): dial again, within the connect
        timeout of the first try, on a new connection that takes over what was queued
        and the replies awaited. False where it is too late, or ``conn`` is not the
        connection to its peer any more; then it closes as lost."""
        peer = conn.peer
        if self.closed or peer is None or self.conns.get(peer) is not conn:
            return False
        started = conn.dial_started or self.loop.time()
        delay = min(0.002 * 2**conn.redials, 0.1)
        if self.loop.time() + delay - started > config.connect_timeout:
            return False
        again = self._dialer(peer)
        again.dial_started, again.redials = started, conn.redials + 1
        again.adopt(conn)
        self.conns[peer] = again
        self._all_conns.discard(conn)
        self._all_conns.add(again)

        async def later() -> None:
            await asyncio.sleep(delay)
            await dial(self.loop, again)

        self.spawn_task(later())
        return True

    @property
    def key(self) -> bytes:
        """The key this runtime's connections authenticate with, unless a peer has its own."""
        return self._own_key if self._own_key is not None else process.job_key()

    def key_for(self, peer: str) -> bytes:
        """The key connections with ``peer`` authenticate with: this runtime's, unless the
        peer was given another one (``peers.set_key``, :mod:`~danaus.actors._peers`)."""
        key = peers.key_of(peer)
        return self.key if key is None else key

    def _dialer(self, addr: str) -> Connection:
        return Connection(self, dialer=True, peer=addr, key=self.key_for(addr))

    def new_peer_at(self, addr: str) -> None:
        """A new peer lives at ``addr``, where an earlier one may have been lost: a TCP
        port (or a Unix socket path) the system handed out again. Sends to ``addr`` dial
        it again instead of failing as lost. Told by whoever learns of the new peer: a
        host mesh attaching its agents, an agent reporting the procs it started."""
        self.lost.pop(addr, None)
        conn = self.conns.get(addr)
        if conn is not None and conn.state is CLOSED:
            del self.conns[addr]

    def expect(self, addr: str) -> Connection:
        """A placeholder for a proc we spawned that will dial us; queues frames until it does."""
        conn = self.conns.get(addr)
        if conn is not None and conn.state is OPEN:
            return conn  # it dialed in already
        conn = Connection(self, dialer=False, peer=addr)
        self.conns[addr] = conn
        return conn

    def connection_open(self, conn: Connection) -> None:
        """Handshake done: route messages for the peer's address over ``conn``."""
        assert conn.peer is not None
        old = self.conns.get(conn.peer)
        if old is conn:
            return
        if old is not None and old.transport is None and old.state is HANDSHAKE:
            conn.adopt(old)  # a proc we spawned has dialed in
            self.conns[conn.peer] = conn
        elif old is None or old.state is CLOSED:
            self.conns[conn.peer] = conn
        peers.ready(conn.peer)

    def connection_lost(self, conn: Connection) -> None:
        self._all_conns.discard(conn)
        if conn.peer is not None and self.conns.get(conn.peer) is conn:
            del self.conns[conn.peer]
            if conn.was_open or conn.dialer:
                # A peer that went away (or could not be reached) stays gone: later
                # sends fail at once instead of redialing, until someone says a new peer
                # took the address (new_peer_at: TCP ports and socket paths are reused).
                self.lost[conn.peer] = conn.close_reason
                for callback in self.on_lost:
                    callback(conn.peer)
        if conn.pending:
            with self.send_lock:  # (a thread registers replies under it: see send_call_from_thread)
                pending, conn.pending = conn.pending, {}
            exited = peers.exit_status(conn.peer or "")
            if isinstance(conn.close_reason, SupervisionError):
                fail_pending(self, conn, pending)  # we gave up on it (no heartbeat): say so
            elif exited is not None and not exited.done():
                # A proc we spawned: its exit status (a signal, a code) makes a better
                # error than "connection reset", and comes within moments.
                self.spawn_task(fail_pending_after_exit(self, conn, pending, exited))
            else:
                fail_pending(self, conn, pending)

    def peer_lost_error(
        self, peer: str, cause: BaseException | None, rank: int = -1
    ) -> SupervisionError:
        """The error of a call to ``rank`` at ``peer``, lost for ``cause``."""
        return peer_lost_error(peer, cause, rank)

    def why_lost(self, addr: str) -> str | None:
        """Why the peer at ``addr`` was lost (its connection closed and it is gone), or
        ``None`` while it is not."""
        if addr not in self.lost:
            return None
        return str(self.lost[addr] or "connection lost")

    def watch_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(addr)`` on this loop whenever a peer is lost (once per
        callback, however often it is asked)."""
        if callback not in self.on_lost:
            self.on_lost.append(callback)

    def open_connection(self, addr: str) -> Connection | None:
        """The connection to ``addr`` if there is one now (never dials, unlike
        :meth:`connection`)."""
        return self.conns.get(addr)

    def on_close(self, closer: Callable[[], Awaitable[object]]) -> None:
        """Run ``closer()`` (a coroutine function) when this runtime closes, after its
        actors stopped and before its connections close (the RDMA manager's)."""
        self.closers.append(closer)

    def local_actor(self, key: str) -> LocalActor | None:
        """The actor of wire key ``key`` living on this loop, if any."""
        return self.actors.get(key)

    def local_actors(self) -> list[LocalActor]:
        """The actors living on this loop now."""
        return list(self.actors.values())

    def fail_peer(self, addr: str, exc: BaseException) -> None:
        """Fail everything waiting on ``addr`` (e.g. a placeholder whose proc never came up)."""
        conn = self.conns.get(addr)
        if conn is not None:
            if conn.transport is None:
                conn.never_opened(exc)
            else:
                conn.fail(exc)

    # ------------------------------------------------------------ ports

    def open_port(self, handler: PortHandler) -> int:
        pid = next(self._port_ids)
        self.ports[pid] = handler
        return pid

    def close_port(self, pid: int) -> None:
        self.ports.pop(pid, None)

    def open_future_port(self, fut: Future[T]) -> int:
        """A port whose one value (or error) resolves ``fut`` directly."""
        pid = next(self._port_ids)
        # Its value comes off the wire untyped: the caller says what it will be. (Not
        # typing.cast: a function call on every call's path.)
        self.ports[pid] = fut  # type: ignore[assignment]
        fut.settled_by_port = True  # (settle() wakes a thread waiting in its get())
        return pid

    def deliver(self, port: int, rank: int, status: int, value: object) -> None:
        handler = self.ports.get(port)
        if handler is None:
            return
        if isinstance(handler, Future):
            del self.ports[port]
            settle(handler, status, value)
        elif handler(rank, status, value):
            self.ports.pop(port, None)

    # ------------------------------------------------------------ dispatch

    def dispatch(self, conn: Connection, msg: Message, parts: Sequence[object]) -> None:
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"no handler for message {type(msg).__name__} from {conn.peer}")
        handler(self, conn, msg, parts)

    def reply_error(self, conn: ReplySink, port: int, rank: int, info: ErrorInfo) -> None:
        if port:
            conn.send(Result(port, ERROR, encode_error(info), False, rank))
        else:
            log.error(
                "%s: %s (no caller waited for this result)", info.actor or self.addr, info.message
            )

    # ------------------------------------------------------------ sending

    def send_call(self, addr: str, rank: int, reply: int, spec: CallSpec) -> None:
        """Send the call ``spec`` to its actor at ``addr`` (rank ``rank`` there); its
        reply (if ``reply``) comes to that port."""
        conn = self.connection(addr)
        with self.send_lock:  # (numbered and queued in one step: see send_call_from_thread)
            actor = spec.actor
            seq = self.next_seq(addr, actor)
            msg = Call(
                actor, spec.method, reply, spec.args, spec.pickled, seq, spec.region, spec.trace
            )
            sent = conn.send(msg, spec.parts)
        if not sent:
            if reply:
                self.deliver(reply, rank, ERROR, self.peer_lost_error(addr, conn.close_reason))
            return
        if reply:
            conn.pending[reply] = rank

    def send_call_from_thread(self, addr: str, rank: int, reply: int, spec: CallSpec) -> bool:
        """:meth:`send_call` from a thread that is not this loop's, written by that thread
        itself, without waking the loop: where the connection to ``addr`` is open on a
        Unix socket with nothing queued (``Connection.write_from_thread``). False, with
        nothing sent, where it is not: the caller hands the send to the loop."""
        conn = self.conns.get(addr)
        if conn is None:
            return False
        actor = spec.actor
        with self.send_lock:
            seq = self.next_seq(addr, actor)
            # (msgspec's module-level encoder: the loop's may be encoding at this moment)
            call = Call(
                actor, spec.method, reply, spec.args, spec.pickled, seq, spec.region, spec.trace
            )
            header = msgspec.msgpack.encode(call)
            if reply:  # (before the write: the reply may come back at once)
                conn.pending[reply] = rank
            written = False
            try:
                written = self.send_from_thread(conn, frame(header, spec.parts))
            finally:  # (not written, or raised: unnumbered and unregistered again)
                if not written:
                    if reply:
                        conn.pending.pop(reply, None)
                    self._seqs[addr][actor] = seq - 1  # (nobody numbered since: we hold it)
            return written

    def call(
        self,
        targets: Sequence[tuple[int, str]],
        reply: int,
        spec: CallSpec,
        reducer: tuple[msgspec.Raw, bool] | None = None,
        here: bool = True,
    ) -> None:
        """Send the call ``spec`` to its actor in each of ``targets`` (rank, proc address):
        the one entry for a call, which picks how it travels. One target: straight to it,
        from this loop (``here``) or written by the calling thread itself where it can;
        several: one by one, or down a casting tree (``_cast``) when they are more than
        ``config.cast_fanout``. Their replies (if ``reply``) come to that port: each
        rank's, or, with a ``reducer`` (an accumulator's (identity, combine), encoded),
        combined on the way up the tree. From another thread, what the loop must send
        is handed to it, after anything that thread handed it before."""
        if len(targets) == 1:
            rank, addr = targets[0]
            if here:
                self.send_call(addr, rank, reply, spec)
            elif not self.send_call_from_thread(addr, rank, reply, spec):
                self.call_soon_handed(self.send_call, addr, rank, reply, spec)
        elif here:
            self._send_cast(targets, reply, spec, reducer)
        else:
            self.call_soon_handed(self._send_cast, targets, reply, spec, reducer)

    def hand_over(self, fn: Callable[[*Ts], object], *args: *Ts) -> Callable[[], None]:
        """For a thread that is not this loop's, about to have the loop call ``fn(*args)``
        (``run_on``, or a call waiting at a gate): that call as the loop is to run it.
        Until it has run, no thread writes a frame itself (:meth:`send_from_thread`), so
        that nothing a thread sends overtakes what it handed the loop before."""
        with self.send_lock:
            self._handed += 1

        def handed() -> None:
            try:
                fn(*args)
            finally:
                with self.send_lock:
                    self._handed -= 1

        return handed

    def call_soon_handed(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        """From a thread that is not this loop's: have the loop call ``fn(*args)``,
        counted as handed over (:meth:`hand_over`) until it has run."""
        handed = self.hand_over(fn, *args)
        try:
            self.loop.call_soon_threadsafe(handed)
        except BaseException:  # (the loop closed): it will never run, so it waits for nothing
            with self.send_lock:
                self._handed -= 1
            raise

    def send_from_thread(self, conn: Connection, bufs: list[Buffer]) -> bool:
        """Write one frame on ``conn`` from a thread that is not this loop's (see
        ``Connection.write_from_thread``), unless something handed to the loop is still
        to run; False, with nothing written, where it may not."""
        with self.send_lock:
            return not self._handed and conn.write_from_thread(bufs)

    def _send_cast(
        self,
        targets: Sequence[tuple[int, str]],
        reply: int,
        spec: CallSpec,
        reducer: tuple[msgspec.Raw, bool] | None,
    ) -> None:
        fanout = config.cast_fanout
        if not fanout or len(targets) <= fanout:
            for rank, addr in targets:
                self.send_call(addr, rank, reply, spec)
            return
        actor = spec.actor
        with self.send_lock:
            tree = [(rank, addr, self.next_seq(addr, actor)) for rank, addr in targets]
        send_tree(
            self,
            actor,
            spec.method,
            tree,
            reply,
            CAST_NONE if not reply else CAST_REDUCE if reducer is not None else CAST_GATHER,
            fanout,
            spec.args,
            spec.pickled,
            spec.parts,
            reducer,
            spec.region,
            spec.trace,
        )

    def next_seq(self, addr: str, actor: str) -> int:
        """The sequence number of the next message to ``actor`` at ``addr`` (its mailbox
        takes each sender's messages in this order, however they travel)."""
        seqs = self._seqs.get(addr)
        if seqs is None:
            seqs = self._seqs[addr] = {}
        seq = seqs[actor] = seqs.get(actor, 0) + 1
        return seq

    # ------------------------------------------------------------ actors' lives

    def spawn(
        self,
        addr: str,
        reply: int,
        rank: int,
        actor: str,
        mesh: str,
        sizes: dict[str, int],
        payload: tuple[msgspec.Raw, bool, Sequence[Buffer]],
        proc_addrs: list[str],
        creators: list[Creator],
    ) -> None:
        """Create actor ``actor`` (rank ``rank`` of actor mesh ``mesh``, laid over procs of
        ``sizes`` at ``proc_addrs``) in the proc at ``addr``, from ``payload`` (the encoded
        ``(cls, args, kwargs)``). Its failures and stuck endpoints are told to this
        runtime's ``SUPERVISOR``. Its ``__init__``'s outcome comes to port ``reply`` as
        rank ``rank``; a peer already lost answers at once."""
        raw, pickled, parts = payload
        conn = self.connection(addr)
        msg = Spawn(actor, reply, mesh, rank, sizes, raw, pickled, self.addr, proc_addrs, creators)
        if conn.send(msg, parts):
            conn.pending[reply] = rank
        else:
            self.deliver(reply, rank, ERROR, self.peer_lost_error(addr, conn.close_reason))

    def stop_actor(self, addr: str, actor: str, reply: int, rank: int) -> None:
        """Stop actor ``actor`` in the proc at ``addr`` (what waits in its mailbox fails);
        port ``reply`` hears, as rank ``rank``, once it has stopped, or at once (an error
        of ``None``) when its proc is gone."""
        conn = self.connection(addr) if addr else None
        if conn is not None and conn.send(StopActor(actor, reply)):
            conn.pending[reply] = rank
        else:
            self.deliver(reply, rank, ERROR, None)

    def stop_proc(self, addr: str) -> None:
        """Ask the proc at ``addr`` to stop its actors and exit."""
        self.connection(addr).send(StopProc(0))

    def cancel(self, actor: str, reply: int, addrs: Iterable[str]) -> None:
        """The caller gave up on the calls to ``actor`` answering to port ``reply``: close
        the port, and tell the procs at ``addrs`` (each drops the call if it is queued,
        cancels it if it runs). A proc not connected now is not dialed for it."""
        self.close_port(reply)
        msg = Cancel(actor, reply)
        for addr in addrs:
            conn = self.open_connection(addr)
            if conn is not None:
                conn.pending.pop(reply, None)
                conn.send(msg)

    # ------------------------------------------------------------ pauses

    def announce_pause(self, paused: bool) -> None:
        """This loop's thread stops in a debugger prompt (``paused``) or goes on.

        Called on this loop's thread. Every open connection's peer is told at once (the
        loop will not flush later), so that it does not declare us lost while we are
        silent. On resuming, the peers' own silence meanwhile is forgiven: we did not read.
        """
        now = self.loop.time()
        msg = Paused(paused)
        for conn in {*self._all_conns, *self.conns.values()}:
            if conn.state is OPEN:
                if not paused:
                    conn.excuse_silence(now)
                conn.send(msg)
                conn.flush()

    # ------------------------------------------------------------ shutdown

    def abandon(self) -> None:
        """Release the listening socket of a runtime whose event loop has closed (its
        connections' sockets are closed by their transports when those are collected)."""
        self.closed = True
        self._listener.abandon()
        self.conns.clear()
        self._all_conns.clear()

    async def aclose(self) -> None:
        """Stop local actors, close every connection and the listening socket."""
        if self.closed:
            return
        self.closed = True
        for actor in list(self.actors.values()):
            await actor.stop()
        for closer in self.closers:
            try:
                await closer()
            except Exception:
                log.exception("closing %r", closer)
        self.actors.clear()
        for conn in list(self._all_conns) + list(self.conns.values()):
            conn.close()
        self._listener.close()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        for pid in list(self.ports):
            self.deliver(pid, -1, ERROR, ClosedError(f"runtime {self.addr} closed"))


def on_ping(rt: Runtime, conn: Connection, msg: Ping, parts: Sequence[object]) -> None:
    """A peer checks we are alive: answer at once."""
    conn.send(_PONG)


def on_pong(rt: Runtime, conn: Connection, msg: Pong, parts: Sequence[object]) -> None:
    """The answer to our ping: its arrival counted as a read, nothing more to do."""


def on_paused(rt: Runtime, conn: Connection, msg: Paused, parts: Sequence[object]) -> None:
    """The peer's loop stops in a debugger prompt, or goes on: excuse its silence."""
    conn.set_peer_paused(msg.paused)
