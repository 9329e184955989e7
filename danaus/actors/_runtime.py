"""The runtime of one event loop: a listening address, connections, ports, local actors.

There is one :class:`Runtime` per event loop that uses danaus: in a proc, the proc's
loop; in the controller, the application's running loop (async code) or danaus's own
background loop (sync code). Messages to a peer go over one connection per peer
address, in the order sent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
from asyncio.events import _get_running_loop
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import msgspec

from ..config import config
from ..errors import (
    ClosedError,
    ProtocolError,
    SerializationError,
    SupervisionError,
)
from . import _auth
from ._address import parse_addr, tls_context
from ._connection import Connection
from ._errinfo import encode_error, error_decode, error_from_info
from ._frame_writer import CLOSED, HANDSHAKE, OPEN
from ._future import Future
from ._part_pool import trim_part_pool
from ._serialize import loads
from ._wire import (
    ERROR,
    OK,
    Buffer,
    Call,
    ErrorInfo,
    Message,
    Paused,
    Ping,
    Pong,
    Region,
    Result,
    SeqSkip,
)

if TYPE_CHECKING:
    from ._instance import ActorInstance

log = logging.getLogger("danaus.runtime")
T = TypeVar("T")

#: A short random id for this controller's job; part of the wire keys of the actors it spawns.
JOB_ID = secrets.token_hex(4)
_PING, _PONG = Ping(), Pong()
#: When the connection to a proc we spawned breaks while the proc is exiting, its calls
#: wait this long (s) for the exit status, which names the cause ("killed by SIGKILL")
#: better than "connection reset". An exiting process is reaped within moments; one
#: still alive after this is reported as unreachable. Not a setting: it only shapes the
#: error message, and only delays failing calls that are failing anyway.
_EXIT_STATUS_WAIT = 0.5


class SkipOnLoss(list[int]):
    """The ranks of a cast subtree waiting on one connection. If it is lost, the actors
    of that subtree that are still alive are told not to wait for the lost message's
    sequence number (else they would hold every later message from that sender)."""

    def __init__(self, actor: str, sender: str, targets: Sequence[tuple[int, str, int]]) -> None:
        super().__init__(r for r, _, _ in targets)
        self.actor = actor
        self.sender = sender
        self.targets = list(targets)

    def send_skips(self, rt: Runtime) -> None:
        for _, addr, seq in self.targets:
            if seq:
                rt.connection(addr).send(SeqSkip(self.actor, seq, self.sender))


class PortHandler(Protocol):
    """Receives what arrives on a port; returns True when the port is finished."""

    def __call__(self, rank: int, status: int, value: Any) -> bool: ...


def _A_REPLY() -> str:
    return "a reply"


def _settle(fut: Future[Any], status: int, value: Any) -> None:
    if not fut.done():
        if status == ERROR:
            fut.set_exception(value)
        else:
            fut.set_result(value)


#: Peers that authenticate with another key than this process's runtimes: host agents
#: attached after those started (``attach_to_hosts``), and the procs they started for
#: us. Address -> key. Connections dialed to them use that key.
peer_keys: dict[str, bytes] = {}

#: Readiness of procs being spawned, by address; set by the runtime that spawned them
#: (thread-safe, so a runtime on another loop can wait for a proc before dialing it).
proc_ready: dict[str, ThreadFuture[None]] = {}
#: For procs this process spawned: a callable telling why the proc is gone, if it is.
peer_exit_reason: dict[str, Callable[[], str | None]] = {}
#: For procs this process spawned: resolves with the exit status when the proc exits.
peer_exited: dict[str, ThreadFuture[int]] = {}

#: What handles a message of the wire union: ``handler(runtime, conn, msg, parts)``.
Handler: TypeAlias = Callable[["Runtime", Connection, Any, list[Any]], None]

#: The handler of each message type, registered in one call by the layer that owns the
#: type: the runtime's own below, the actor layer's (``danaus.actors``), the mesh
#: layer's (``danaus.mesh``). A test checks that every type has one in a fresh proc.
_handlers: dict[type, Handler] = {}
#: checks every runtime runs on its heartbeat (``register_handlers``' companion)
_on_heartbeat: list[Callable[[Runtime], None]] = []


def on_every_heartbeat(check: Callable[[Runtime], None]) -> None:
    """Run ``check(runtime)`` on every heartbeat of every runtime, present and future."""
    from ._loops import all_runtimes

    _on_heartbeat.append(check)
    for rt in all_runtimes():
        rt.on_heartbeat.append(check)


def register_handlers(handlers: Mapping[type, Handler]) -> None:
    """Handle these message types (in every runtime, present and future)."""
    from ._loops import all_runtimes

    _handlers.update(handlers)
    for rt in all_runtimes():
        rt.handlers.update(handlers)


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
        self.key = key if key is not None else _auth.job_key()
        # A name nobody can predict: abstract socket names are listed to every local
        # process (/proc/net/unix), and one made of the job id, the pid and a counter could
        # be bound by another process before this runtime binds it.
        self.addr = addr or f"unix:@danaus-{secrets.token_hex(16)}"
        self.conns: dict[str, Connection] = {}
        self.ports: dict[int, Any] = {}  # PortHandler, or a Future for one reply
        self.actors: dict[str, ActorInstance] = {}
        self.closed = False
        #: a runtime on an application's own loop (made on first use, not by danaus)
        self.borrowed = False
        self.stop_requested: asyncio.Future[None] = loop.create_future()
        self._port_ids = itertools.count(1)
        #: peers whose connection was lost, and why: sends to them fail at once
        self.lost: dict[str, BaseException | None] = {}
        #: messages that arrived before their actor's Spawn, by actor; and actors whose
        #: wait expired, or that were stopped (messages for those fail at once)
        self.awaiting: dict[str, list[Callable[[], None]]] = {}
        self.expired: set[str] = set()
        self.gone_actors: set[str] = set()
        #: cast tree nodes in this proc waiting for a subtree, by port
        self.gathers: dict[int, Any] = {}
        #: last sequence number sent, per proc address and actor
        self.seqs: dict[str, dict[str, int]] = {}
        #: the handler of each message type (see ``register_handlers``)
        self.handlers: dict[type, Handler] = dict(_handlers)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._all_conns: set[Connection] = set()
        self._refused = 0  # strangers refused since the last log line about them
        self._refused_logged = -1e9
        self._server: asyncio.AbstractServer | None = None
        self._sock = sock if sock is not None else self._bind(self.addr)
        self._sock.setblocking(False)
        if self.addr.startswith("tcp://") and self.addr.endswith(":0"):
            host, port = self._sock.getsockname()[:2]  # port 0: the kernel picked one
            self.addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self.on_lost: list[Callable[[str], None]] = []
        #: called on every heartbeat (layers above: the actor layer's stuck-endpoint check)
        self.on_heartbeat: list[Callable[[Runtime], None]] = list(_on_heartbeat)
        #: coroutines to run when the runtime closes (layers above: the RDMA manager)
        self.closers: list[Callable[[], Any]] = []
        self.spawn_task(self._serve())
        loop.call_later(config.heartbeat_interval, self._heartbeat)

    def __repr__(self) -> str:
        return f"<Runtime {self.addr} conns={len(self.conns)} actors={len(self.actors)}>"

    # ------------------------------------------------------------ setup

    @staticmethod
    def _bind(addr: str) -> socket.socket:
        """Bind now, so peers can dial before the server task first runs."""
        family, where = parse_addr(addr)
        if family == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            sock = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
            sock.listen(512)
        except BaseException:
            sock.close()  # e.g. the address is taken: no socket left for the GC to warn about
            raise
        sock.setblocking(False)
        return sock

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

    async def _serve(self) -> None:
        if self._sock.family == socket.AF_UNIX:
            self._server = await self.loop.create_unix_server(self._accept, sock=self._sock)
        else:
            self._server = await self.loop.create_server(
                self._accept, sock=self._sock, ssl=tls_context(server=True)
            )

    def _accept(self) -> Connection:
        conn = Connection(self, dialer=False)
        self._all_conns.add(conn)
        return conn

    def admit(self, conn: Connection) -> bool:
        """May this accepted, not yet authenticated connection stay? Strangers are
        bounded: past ``config.max_unauthenticated`` of them, new ones are closed."""
        waiting = sum(
            1 for c in self._all_conns if c.state is HANDSHAKE and not c.dialer and c is not conn
        )
        if waiting < config.max_unauthenticated:
            return True
        self._refused += 1
        now = self.loop.time()
        if now - self._refused_logged >= 1.0:  # a flood logs a line a second, not a line each
            self._refused_logged = now
            log.error(
                "refused %d connection(s): %d are already waiting to authenticate "
                "(config.max_unauthenticated)",
                self._refused,
                config.max_unauthenticated,
            )
            self._refused = 0
        return False

    def spawn_task(self, coro: Any, *, log_failure: bool = True) -> asyncio.Task[Any]:
        """Run ``coro`` as a task owned by this runtime (cancelled at close).

        Its failure is logged, unless ``log_failure`` is False: then whoever takes the
        task's outcome reports it (an error is logged once, where nobody else gets it).
        """
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done if log_failure else self._tasks.discard)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
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
        self.conns[addr] = conn
        self._all_conns.add(conn)
        self.spawn_task(self._dial(conn))
        return conn

    def key_for(self, peer: str) -> bytes:
        """The key connections with ``peer`` authenticate with: this runtime's, unless the
        peer was given another one (:data:`peer_keys`)."""
        return peer_keys.get(peer, self.key)

    def _dialer(self, addr: str) -> Connection:
        key = self.key_for(addr)
        if key == self.key:
            return Connection(self, dialer=True, peer=addr)
        # A Connection takes its runtime's key when it is made (on this loop's thread,
        # like every use of the key): this peer's, for this connection only.
        own, self.key = self.key, key
        try:
            return Connection(self, dialer=True, peer=addr)
        finally:
            self.key = own

    def expect(self, addr: str) -> Connection:
        """A placeholder for a proc we spawned that will dial us; queues frames until it does."""
        conn = self.conns.get(addr)
        if conn is not None and conn.state is OPEN:
            return conn  # it dialed in already
        conn = Connection(self, dialer=False, peer=addr)
        self.conns[addr] = conn
        return conn

    async def _dial(self, conn: Connection) -> None:
        assert conn.peer is not None
        try:
            ready = proc_ready.get(conn.peer)
            if ready is not None and not ready.done():
                await asyncio.wrap_future(ready)
            family, where = parse_addr(conn.peer)
            # Every address is listening before anyone learns it (runtimes bind as they
            # are made; a proc's socket is bound by its spawner and handed to it), so a
            # refused connection means its owner is gone: fail now, not after retries.
            # Only a socket file that does not exist yet may still be on its way.
            deadline = self.loop.time() + config.connect_timeout
            delay = 0.002
            while True:
                try:
                    await self._connect(conn, family, where)
                    break
                except ConnectionRefusedError as e:
                    raise ConnectionRefusedError(
                        f"nothing listens at {conn.peer} any more (its proc exited)"
                    ) from e
                except FileNotFoundError:
                    if self.loop.time() + delay > deadline:
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            conn.never_opened(e)

    async def _connect(self, conn: Connection, family: str, where: Any) -> None:
        if family == "unix":
            # Connect the socket ourselves: uvloop cannot take abstract (NUL) names.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await self.loop.sock_connect(sock, where)
            except BaseException:
                sock.close()
                raise
            await self.loop.create_unix_connection(lambda: conn, sock=sock)
        else:
            ctx = tls_context(server=False)
            transport, _ = await self.loop.create_connection(
                lambda: conn, *where, ssl=ctx, server_hostname=where[0] if ctx else None
            )
            tsock = transport.get_extra_info("socket")
            if tsock is not None:
                tsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

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
        ready = proc_ready.get(conn.peer)
        if ready is not None and not ready.done():
            ready.set_result(None)

    def connection_lost(self, conn: Connection) -> None:
        self._all_conns.discard(conn)
        if conn.peer is not None and self.conns.get(conn.peer) is conn:
            del self.conns[conn.peer]
            if conn.was_open or conn.dialer:
                # A peer that went away (or could not be reached) stays gone: addresses
                # are never reused, so later sends fail at once instead of redialing.
                self.lost[conn.peer] = conn.close_reason
                for callback in self.on_lost:
                    callback(conn.peer)
        if conn.pending:
            pending, conn.pending = conn.pending, {}
            exited = peer_exited.get(conn.peer or "")
            if isinstance(conn.close_reason, SupervisionError):
                self._fail_pending(conn, pending)  # we gave up on it (no heartbeat): say so
            elif exited is not None and not exited.done():
                # A proc we spawned: its exit status (a signal, a code) makes a better
                # error than "connection reset", and comes within moments.
                self.spawn_task(self._fail_pending_after_exit(conn, pending, exited))
            else:
                self._fail_pending(conn, pending)

    def _fail_pending(self, conn: Connection, pending: dict[int, int | list[int]]) -> None:
        for port, ranks in pending.items():
            for rank in ranks if isinstance(ranks, list) else (ranks,):
                self.deliver(
                    port,
                    rank,
                    ERROR,
                    self.peer_lost_error(conn.peer or "(unknown)", conn.close_reason, rank),
                )
            if isinstance(ranks, SkipOnLoss):
                ranks.send_skips(self)

    async def _fail_pending_after_exit(
        self, conn: Connection, pending: dict[int, int | list[int]], exited: ThreadFuture[int]
    ) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(exited)), _EXIT_STATUS_WAIT)
        except TimeoutError:
            pass  # alive but unreachable: say so
        finally:
            self._fail_pending(conn, pending)

    def peer_lost_error(
        self, peer: str, cause: BaseException | None, rank: int = -1
    ) -> SupervisionError:
        why = None
        describe = peer_exit_reason.get(peer)
        if describe is not None and not isinstance(cause, SupervisionError):
            why = describe()
        if why is None:
            if isinstance(cause, SupervisionError):
                why = str(cause)
            elif cause:
                why = f"connection lost ({type(cause).__name__}: {cause})"
            else:
                why = "connection lost"
        who = f"rank {rank}: " if rank >= 0 else ""
        return SupervisionError(f"{who}proc at {peer} failed: {why}")

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

    def open_future_port(self, fut: Future[Any]) -> int:
        """A port whose one value (or error) resolves ``fut`` directly."""
        pid = next(self._port_ids)
        self.ports[pid] = fut
        return pid

    def deliver(self, port: int, rank: int, status: int, value: Any) -> None:
        handler = self.ports.get(port)
        if handler is None:
            return
        if type(handler) is Future:
            del self.ports[port]
            _settle(handler, status, value)
        elif handler(rank, status, value):
            self.ports.pop(port, None)

    # ------------------------------------------------------------ dispatch

    def dispatch(self, conn: Connection, msg: Message, parts: list[Any]) -> None:
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"no handler for message {type(msg).__name__} from {conn.peer}")
        handler(self, conn, msg, parts)

    def await_actor(self, actor: str, retry: Callable[[], None]) -> bool:
        """Hold a message for ``actor`` until its Spawn arrives (it may have come another
        way, e.g. down a cast tree, and overtaken the Spawn), at most ``spawn_wait`` s.

        Returns False when there is nothing to wait for: fail the message now.
        """
        if "." not in actor or actor in self.gone_actors or actor in self.expired:
            return False  # not a spawned actor's key ("name.job.n"), or known gone
        waiting = self.awaiting.get(actor)
        if waiting is None:
            waiting = self.awaiting[actor] = []

            def expire() -> None:
                if actor in self.awaiting:
                    self.expired.add(actor)
                    self.release_actor(actor)

            self.loop.call_later(config.spawn_wait, expire)
        waiting.append(retry)
        return True

    def release_actor(self, actor: str) -> None:
        """``actor`` exists now (or never will): redeliver what waited for it, in order."""
        for retry in self.awaiting.pop(actor, []):
            retry()

    def no_actor(self, actor: str) -> ErrorInfo:
        why = (
            "it was stopped"
            if actor in self.gone_actors
            else (f"it has: {sorted(self.actors) or 'none'}")
        )
        return ErrorInfo(
            "supervision",
            actor,
            "",
            "SupervisionError",
            f"no actor named {actor!r} in proc {self.addr} ({why})",
            "",
        )

    def reply_error(self, conn: Connection, port: int, rank: int, info: ErrorInfo) -> None:
        if port:
            conn.send(Result(port, ERROR, encode_error(info), False, rank))
        else:
            log.error(
                "%s: %s (no caller waited for this result)", info.actor or self.addr, info.message
            )

    # ------------------------------------------------------------ sending

    def send_call(
        self,
        addr: str,
        actor: str,
        method: str,
        reply: int,
        rank: int,
        args: msgspec.Raw,
        pickled: bool,
        parts: Sequence[Buffer],
        region: Region | None = None,
    ) -> None:
        """Send one call to ``actor`` at ``addr``; its reply (if ``reply``) comes to that port.
        ``region``: the slice called, when not the actor's whole mesh (its message rank)."""
        conn = self.connection(addr)
        seqs = self.seqs.get(addr)
        if seqs is None:
            seqs = self.seqs[addr] = {}
        seq = seqs[actor] = seqs.get(actor, 0) + 1
        if not conn.send(Call(actor, method, reply, args, pickled, seq, region), parts):
            if reply:
                self.deliver(reply, rank, ERROR, self.peer_lost_error(addr, conn.close_reason))
            return
        if reply:
            conn.pending[reply] = rank

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
        self._sock.close()
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
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        for pid in list(self.ports):
            self.deliver(pid, -1, ERROR, ClosedError(f"runtime {self.addr} closed"))


def _on_result(rt: Runtime, conn: Connection, msg: Result, parts: list[Any]) -> None:
    port = msg.port
    conn.pending.pop(port, None)
    handler = rt.ports.get(port)
    if handler is None:
        return  # a reply nobody waits for any more (e.g. a timed-out call)
    status = msg.status
    try:
        if status == OK:
            value = loads(msg.value, msg.pickled, parts, _A_REPLY)
        elif status == ERROR:
            value = error_from_info(error_decode(msg.value))
        else:
            value = None
    except (SerializationError, msgspec.DecodeError) as e:
        status, value = ERROR, SerializationError(str(e))
    if type(handler) is Future:
        del rt.ports[port]
        _settle(handler, status, value)
    elif handler(msg.rank, status, value):
        rt.ports.pop(port, None)


def _on_ping(rt: Runtime, conn: Connection, msg: Ping, parts: list[Any]) -> None:
    conn.send(_PONG)


def _on_pong(rt: Runtime, conn: Connection, msg: Pong, parts: list[Any]) -> None:
    pass  # its arrival counted as a read


def _on_paused(rt: Runtime, conn: Connection, msg: Paused, parts: list[Any]) -> None:
    conn.set_peer_paused(msg.paused)


_handlers.update(
    {Result: _on_result, Ping: _on_ping, Pong: _on_pong, Paused: _on_paused}
)  # no runtime yet
