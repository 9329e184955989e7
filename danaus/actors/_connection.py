"""One authenticated control-plane connection: its lifecycle, reading and liveness.

Reading is an ``asyncio.BufferedProtocol`` whose buffer belongs to a
:class:`~danaus.actors._frame_reader.FrameReader` (bytes in, frames out, no socket); the
handshake is a :class:`~danaus.actors._handshake.HandshakeMachine` (headers in, frames to send
out). This class moves bytes between the transport and those two, hands each message
to the runtime, holds reading while a mailbox is full, and pings a quiet peer. It also
writes, beside its protocol as asyncio's own transports keep flow control: messages sent
during one loop iteration go out in one ``writelines`` call (or at once past
``config.flush_bytes``), frames queued while the handshake runs wait in a backlog (with
hooks that report them if they never go out), frames on TCP without TLS carry session
tags, and the transport's write flow control pauses senders that outrun the peer.

One write comes from other threads: a call sent from a thread that is not the loop's
(a plain thread's ``.get()``, a sync endpoint calling another actor) is written to the
socket by that thread itself when nothing is queued before it (:meth:`write_from_thread`),
instead of waking the loop to write it. Every write to the socket, the loop's included,
holds the runtime's ``send_lock``, so frames never interleave.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import select
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..config import config
from ..errors import AuthenticationError, ProtocolError, SupervisionError
from ._frame_reader import FrameReader
from ._frame_tags import TAG_BYTES, FrameMacs, frame_macs, frame_tag
from ._handshake import HandshakeMachine
from ._wire import MAGIC, PREFIX, Buffer, Message, Ping, frame

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["CLOSED", "HANDSHAKE", "OPEN", "Connection", "State"]

log = logging.getLogger("danaus.connection")

_PING = Ping()
#: the most buffers one frame written from another thread may have (writev's limit is
#: 1,024 on Linux): more go through the loop
_MAX_IOV = 256


class State(enum.Enum):
    """Where a connection is: authenticating, open, or closed for good."""

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


# Module-level aliases: looking up an Enum member on its class is slow on Python 3.11.
HANDSHAKE, OPEN, CLOSED = State.HANDSHAKE, State.OPEN, State.CLOSED


class Connection(asyncio.BufferedProtocol):
    """A framed, authenticated connection to one peer (a proc or a controller).

    Either side may send: the dialer announces its own listening address, so the
    acceptor routes messages for that address over this same connection.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        dialer: bool,
        peer: str | None = None,
        key: bytes | None = None,
    ) -> None:
        self.rt = runtime
        self.loop = runtime.loop
        self.dialer = dialer
        self.peer = peer
        self.state = HANDSHAKE
        self.transport: asyncio.Transport | None = None
        self.close_reason: BaseException | None = None
        self.was_open = False
        #: reads so far, and when the heartbeat last saw the count change
        self.reads = 0
        #: bytes read from the socket (``stats()``)
        self.bytes_in = 0
        self.seen_reads = -1
        self.quiet_since = 0.0
        #: the peer said its loop is paused (a debugger prompt): its silence is excused
        self.peer_paused = False
        #: reply port id -> rank of the callee (or the ranks of a cast subtree), for
        #: calls whose reply comes back here; failed if the connection is lost
        self.pending: dict[int, int | list[int]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        #: bytes written to the socket (``stats()``)
        self.bytes_out = 0
        self._wq: list[Buffer] = []
        self._wbytes = 0
        self._flush_handle: asyncio.Handle | None = None
        #: inside a burst (the connection handling what it read, or a batch): what is sent
        #: is flushed at its end
        self._reading = False
        self.write_paused = False
        self._writable_waiters: list[asyncio.Future[None]] = []
        self._backlog: list[tuple[bytes, Sequence[Buffer]]] = []  # frames while connecting
        self._backlog_msgs = 0  # messages in _backlog: reported if they are never sent
        self._undelivered: list[Callable[[BaseException | None], None]] = []
        #: TCP without TLS, once open: the outgoing session tag makers, and the sequence
        #: number of the next frame
        self._mac_out: FrameMacs | None = None
        self._seq_out = 0
        #: held by every write to the socket: the loop's, and another thread's
        #: (:meth:`write_from_thread`); the runtime's, as its sequence numbers are
        self._wlock = runtime.send_lock
        #: other threads' own duplicate of a Unix socket's descriptor, made on the loop
        #: with the connection and closed with it (the loop closing its descriptor cannot
        #: make theirs name another file); -1: they may not write here
        self._thread_fd = -1
        #: a thread is inside write_from_thread (a call made from a finalizer or a signal
        #: handler in the middle of it must not write into its frame: the lock is re-entrant)
        self._thread_writing = False
        # Messages go straight to the runtime: no call through this class per frame.
        self._reader = FrameReader(
            functools.partial(runtime.dispatch, self), self._on_handshake, self._peer_name
        )
        # The transport fills the reader's buffers with no call through this class.
        self.get_buffer = self._reader.get_buffer  # type: ignore[method-assign]
        self._hs = HandshakeMachine(
            runtime.key if key is None else key,
            dialer=dialer,
            addr=runtime.addr,
            peer_name=self._peer_name,
        )
        self._hs_timer: asyncio.TimerHandle | None = None
        #: a dialer's first try, and how many times it dialed again after a reset
        self.dial_started = 0.0
        self.redials = 0
        #: when the transport came up (the oldest stranger is dropped first)
        self.handshake_started = 0.0
        self._read_holders: set[object] = set()
        #: TCP without TLS: every frame after the handshake carries a tag under a session
        #: key, over a per-direction sequence number and the frame
        self._tag_frames = False
        #: set for a connection relayed through a socket pair (``attach``'s gateway): tag
        #: frames as the far end's socket, which this side cannot see, makes it do
        self.tag_as_tcp: bool | None = None

    @classmethod
    def lost(cls, runtime: Runtime, peer: str, reason: BaseException | None) -> Connection:
        """A connection to a peer already lost: closed from the start, for ``reason``."""
        conn = cls(runtime, dialer=True, peer=peer)
        conn.state = CLOSED
        conn.close_reason = reason
        return conn

    def __repr__(self) -> str:
        side = "dialer" if self.dialer else "acceptor"
        return f"<Connection {side} peer={self.peer} {self.state.value}>"

    # ------------------------------------------------------------ lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        if not self.dialer:
            self.rt.admit(self)  # (past the bound, the oldest stranger makes room)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            n = config.socket_buffer_bytes
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, n)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, n)
            except OSError:
                pass
        if self.tag_as_tcp is not None:
            self._tag_frames = self.tag_as_tcp
        elif (
            sock is not None
            and sock.family in (socket.AF_INET, socket.AF_INET6)
            and transport.get_extra_info("sslcontext") is None
        ):
            self._tag_frames = True  # TCP without TLS: bind each frame to this session
        if sock is not None and sock.family == socket.AF_UNIX and not self._tag_frames:
            try:  # (untagged frames on a Unix socket: other threads may write them)
                self._thread_fd = os.dup(sock.fileno())
            except OSError:  # (out of descriptors: they hand their frames over)
                self._thread_fd = -1
        if self.dialer:
            self._write_now(self._hs.start())
        # Both sides: a peer that accepts (or dials) and then says nothing is dropped.
        self.handshake_started = self.loop.time()
        self._hs_timer = self.loop.call_later(self._hs.deadline, self._handshake_expired)

    def _handshake_expired(self) -> None:
        self._hs_timer = None
        if self.state is not HANDSHAKE:
            return
        waited = self.loop.time() - self.handshake_started
        again = self._hs.look_again_in(waited, unread=self._unread_bytes_waiting())
        if again is not None:
            self._hs_timer = self.loop.call_later(again, self._handshake_expired)
            return
        why = f"peer {self._peer_name()} did not authenticate within {self._hs.deadline} s"
        self.fail(AuthenticationError(why))

    def _unread_bytes_waiting(self) -> bool:
        """Has the peer sent bytes that this side has not read yet?"""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return bool(readable)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hs_timer is not None:
            self._hs_timer.cancel()
        self._reader.paused = True
        with self._wlock:  # (no thread is writing, or registering a reply, from here on)
            if self.state is not CLOSED:
                self.state = CLOSED
                if self.close_reason is None:
                    self.close_reason = exc or ConnectionResetError(
                        f"connection to {self.peer} closed"
                    )
            if self._thread_fd >= 0:
                fd, self._thread_fd = self._thread_fd, -1
                try:
                    os.close(fd)
                except OSError:  # (already gone: nothing to release)
                    pass
        self._reader.close()
        if self._reset_before_a_word() and self.rt.redial(self):
            return  # a new dial took over its frames and awaited replies
        self._report_unsent(self._peer_name())
        self.resume_writing()  # wake writers: their sends now fail
        self.rt.connection_lost(self)

    def _reset_before_a_word(self) -> bool:
        """Did the peer we dialed close on us before sending a byte? (A listener shedding
        strangers does that; a peer that refuses our key answers the handshake first,
        and our own handshake deadline or a bad frame closes with a reason of its own.)"""
        return (
            self.dialer
            and not self.was_open
            and self.bytes_in == 0
            and not isinstance(
                self.close_reason, (AuthenticationError, ProtocolError, SupervisionError)
            )
        )

    def never_opened(self, exc: BaseException) -> None:
        """The peer could not be reached (a refused dial, a proc that never came up):
        this connection is closed, and what was queued on it is reported."""
        self.state = CLOSED
        self.close_reason = exc
        self._report_unsent(self._peer_name())
        self.rt.connection_lost(self)

    def _peer_name(self) -> str:
        if self.peer:
            return self.peer
        if self.transport is not None:
            name = self.transport.get_extra_info("peername")
            if name:
                return str(name)
        return "(unknown peer)"

    def fail(self, exc: BaseException) -> None:
        """Close this connection because of ``exc`` (logged); the proc keeps serving."""
        if self.state is CLOSED:
            return
        if not self.dialer and not self.was_open and self.transport is not None:
            self.rt.stranger_closed(exc)  # a stranger: counted, a line a second
        elif isinstance(exc, AuthenticationError):
            log.error("refused connection: %s", exc)
        elif isinstance(exc, ProtocolError):
            log.error("closing connection from %s: %s", self._peer_name(), exc)
        with self._wlock:
            self.state = CLOSED
        self._reader.paused = True  # (no more frames from the buffer)
        self.close_reason = exc
        if self.transport is not None:
            self.transport.abort()
        else:
            self.never_opened(exc)

    def heartbeat(self, now: float) -> None:
        """One liveness check (the runtime's heartbeat, every ``heartbeat_interval``): ping
        a quiet peer; fail this connection if the peer stayed silent past
        ``heartbeat_timeout``.

        A proc that is alive at the socket level but frozen (SIGSTOP, a deadlock in C
        code) stops answering, and its callers' pending calls fail instead of hanging.
        """
        if self.state is not OPEN or self.peer_paused:
            return  # (a paused peer reads nothing: no ping either)
        if self._read_holders:
            # We stopped reading ourselves (a full mailbox): the peer's silence says
            # nothing about it, and it cannot hear our pongs to its pings. Tell it we
            # are alive by pinging it ourselves (it reads them: it is not held).
            self.seen_reads = self.reads
            self.quiet_since = now
            self.send(_PING)
        elif self.reads != self.seen_reads:  # something arrived: alive
            self.seen_reads = self.reads
            self.quiet_since = now
        elif now - self.quiet_since > config.heartbeat_timeout:
            self.fail(
                SupervisionError(
                    f"peer {self.peer} did not answer for {config.heartbeat_timeout} s "
                    "(frozen, stopped, or partitioned)"
                )
            )
        elif now - self.quiet_since >= config.heartbeat_interval:
            self.send(_PING)

    def set_peer_paused(self, paused: bool) -> None:
        """The peer's loop stops (a debugger prompt: its silence is no sign of loss) or goes
        on (or its debugger session was lost: silence counts again). Silence until now is
        excused either way."""
        self.peer_paused = paused
        self.excuse_silence(self.loop.time())

    def excuse_silence(self, now: float) -> None:
        """Count the peer as heard from ``now``: a loop that was paused (ours, or the
        peer's) did not read, so the silence before says nothing about the peer."""
        self.seen_reads = self.reads
        self.quiet_since = now

    def close(self) -> None:
        """Flush what is queued, then close."""
        with self._wlock:  # (no thread's frame between the flush and the close)
            self.flush()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

    # ------------------------------------------------------------ holding reads

    def hold_reading(self, holder: object) -> None:
        """Stop reading from the peer until every holder lets go (a full mailbox)."""
        if not self._read_holders and self.transport is not None:
            self.transport.pause_reading()
        self._read_holders.add(holder)
        self._reader.paused = True  # (the rest waits in the buffer)

    def release_reading(self, holder: object) -> None:
        if holder not in self._read_holders:
            return
        self._read_holders.discard(holder)
        if not self._read_holders and self.state is not CLOSED:
            self._reader.paused = False
            if self.transport is not None:
                self.transport.resume_reading()
                self.loop.call_soon(self._resume_parse)

    def _resume_parse(self) -> None:
        """Parse what stayed in the buffer while reading was held."""
        if self._read_holders or self.state is CLOSED or self._reader.receiving_part:
            return
        self.buffer_updated(0)

    def adopt(self, placeholder: Connection) -> None:
        """Take over frames and pending replies queued on a placeholder for this peer."""
        self.pending.update(placeholder.pending)
        placeholder.pending.clear()
        self._adopt_backlog(placeholder)

    def _open(self) -> None:
        with self._wlock:  # (other threads write to an open connection: the backlog first)
            self.state = OPEN
            self.was_open = True
            if self._hs_timer is not None:
                self._hs_timer.cancel()
                self._hs_timer = None
            if self._tag_frames:
                out_key, in_key = self._hs.frame_keys()
                self._start_tagging(frame_macs(out_key))
                self._reader.open(frame_macs(in_key))
            else:
                self._reader.open()
            self._send_backlog()
        self.rt.connection_open(self)

    # ------------------------------------------------------------ reading

    def buffer_updated(self, nbytes: int) -> None:
        if self.state is CLOSED:
            return
        self.reads += 1  # the heartbeat sees whether the peer said anything lately
        self.bytes_in += nbytes
        try:
            self._reading = True
            if not self._reader.buffer_updated(nbytes):  # (it hands out what is whole)
                return  # a large part is still arriving
        except ProtocolError as e:
            self.fail(e)
            return
        finally:
            self._reading = False
        if self._wq:  # replies made while handling it go out now, in one write
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self.flush()

    def eof_received(self) -> bool | None:
        if self._reader.mid_frame:
            self.fail(ProtocolError(f"peer {self._peer_name()} closed mid-frame (truncated frame)"))
        return None

    def _on_handshake(self, header: bytes) -> None:
        """Take one handshake frame: answer it, and open once the peer proved the key."""
        hs = self._hs
        reply = hs.receive(header)
        if hs.peer_addr is not None:
            self.peer = hs.peer_addr
        if reply:
            self._write_now(reply)
        if hs.done:
            self._open()

    # ------------------------------------------------------------ flow control

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark: the peer is not keeping up."""
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiters, self._writable_waiters = self._writable_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def writable(self) -> None:
        """Wait while this connection's outgoing buffer is over its high-water mark."""
        self.flush()
        while self.write_paused and self.state is not CLOSED:
            w = self.loop.create_future()
            self._writable_waiters.append(w)
            await w

    # ------------------------------------------------------------ writing

    def send(self, msg: Message, parts: Sequence[Buffer] = ()) -> bool:
        """Queue one message; False when the connection is closed."""
        return self.send_encoded(self._encoder.encode(msg), parts)

    def send_reported(
        self,
        msg: Message,
        parts: Sequence[Buffer],
        undelivered: Callable[[BaseException | None], None],
    ) -> bool:
        """:meth:`send` for a message that nobody answers (a port value): if it is queued
        now, while connecting, and the connection then fails, ``undelivered(reason)``
        is called instead of the message vanishing."""
        if not self.send(msg, parts):
            return False
        if self.state is HANDSHAKE:
            self._undelivered.append(undelivered)
        return True

    def send_encoded(self, header: bytes, parts: Sequence[Buffer] = ()) -> bool:
        """Queue one already-encoded header (shared by sends of one cast)."""
        state = self.state
        if state is OPEN:
            # Under the lock: another thread may write a frame meanwhile, or queue the
            # rest of one the socket took only in part (see write_from_thread).
            with self._wlock:
                if (
                    self._mac_out is not None
                    and not parts
                    and not self._wq
                    and not self.pending
                    and not self._reading
                ):
                    self._enqueue(header, parts)  # a lone message: out now, as below
                    self.flush()
                    return True
                if parts or self._mac_out is not None:
                    self._enqueue(header, parts)
                else:
                    data = PREFIX.pack(MAGIC, len(header), 0) + header
                    if not self._wq and not self.pending and not self._reading:
                        # A lone message (nothing queued, nothing in flight): send it now
                        # rather than a loop turn later. Bursts still go out batched.
                        self.transport.write(data)  # type: ignore[union-attr]
                        self.bytes_out += len(data)
                        return True
                    self._wq.append(data)
                    self._wbytes += len(data)
                if self._wbytes >= config.flush_bytes:
                    self.flush()
                elif self._flush_handle is None and not self._reading:
                    self._flush_handle = self.loop.call_soon(self.flush)
                return True
        if state is HANDSHAKE:
            self._backlog.append((header, parts))
            self._backlog_msgs += 1
            return True
        return False

    def _enqueue(self, header: bytes, parts: Sequence[Buffer]) -> None:
        """Queue one frame (tagged, where frames are bound to the session)."""
        bufs = frame(header, parts)
        size = sum(memoryview(b).nbytes for b in bufs)
        if self._mac_out is not None:
            bufs.append(frame_tag(self._mac_out, self._seq_out, size, bufs))
            self._seq_out += 1
            size += TAG_BYTES
        self._wq.extend(bufs)
        self._wbytes += size

    def batch_begin(self) -> bool:
        """Queue what is sent from now on until :meth:`batch_end`, which writes it at once
        (a burst of replies, one syscall). False when a burst is already open here (a
        read being handled, or another batch): its end writes, so skip ``batch_end``."""
        if self._reading:
            return False
        self._reading = True
        return True

    def batch_end(self) -> None:
        self._reading = False
        if self._wq:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self.flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now."""
        self._flush_handle = None
        with self._wlock:
            wq = self._wq
            if wq and self.transport is not None and self.state is not CLOSED:
                self.bytes_out += self._wbytes
                if len(wq) == 1:
                    self.transport.write(wq[0])  # one buffer: cheaper than writelines()
                else:
                    self.transport.writelines(wq)
            self._wq = []
            self._wbytes = 0

    def write_from_thread(self, bufs: list[Buffer]) -> bool:
        """Write one frame from a thread that is not the loop's, the caller holding the
        runtime's ``send_lock``: only on an open Unix socket whose frames carry no
        session tags, with nothing queued before it (here or in the transport), so that
        it goes out in order. What the socket does not take at once is queued for the
        loop to write. False (nothing written) where it may not: the caller hands the
        message to the loop instead."""
        transport = self.transport
        fd = self._thread_fd
        if (
            fd < 0  # (not a Unix socket, or its frames carry session tags)
            or self._thread_writing
            or self.state is not OPEN
            or self._wq
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size()
            or len(bufs) > _MAX_IOV
            or self.loop.is_closed()
        ):
            return False
        self._thread_writing = True
        try:
            self._write_on(fd, bufs)
        finally:
            self._thread_writing = False
        return True

    def _write_on(self, fd: int, bufs: list[Buffer]) -> None:
        size = sum(memoryview(b).nbytes for b in bufs)
        try:
            n = os.writev(fd, bufs) if len(bufs) > 1 else os.write(fd, bufs[0])
        except BlockingIOError:
            n = 0
        except OSError as e:  # the peer is gone: the loop fails the connection, and the
            # calls pending on it (this one's included) with the reason
            self.loop.call_soon_threadsafe(self.fail, ConnectionResetError(f"write failed: {e}"))
            return
        self.bytes_out += n
        if n < size:  # the rest, in order before anything sent after it: the loop's to write
            rest: list[Buffer] = []
            skip = n
            for b in bufs:
                view = memoryview(b).cast("B")
                if skip >= view.nbytes:
                    skip -= view.nbytes
                    continue
                rest.append(view[skip:])
                skip = 0
            self._wq = rest
            self._wbytes = size - n  # (counted in bytes_out when the loop writes them)
            self.loop.call_soon_threadsafe(self.flush)

    def _write_now(self, bufs: list[Buffer]) -> None:
        assert self.transport is not None
        self.transport.writelines(bufs)

    # ------------------------------------------------------------ the handshake's backlog

    def _start_tagging(self, macs: FrameMacs) -> None:
        """Tag every frame from now on with the session's outgoing tag makers."""
        self._mac_out = macs

    def _send_backlog(self) -> None:
        """The connection opened: what was queued while connecting goes out now."""
        if self._backlog:
            for header, parts in self._backlog:
                self._enqueue(header, parts)
            self._backlog = []
            self._backlog_msgs = 0
            self.flush()
        self._undelivered = []

    def _adopt_backlog(self, placeholder: Connection) -> None:
        """Send, here, what was queued on a placeholder for the same peer (or, while this
        one is connecting too, queue it here, in order, behind its handshake)."""
        if self.state is HANDSHAKE:
            self._backlog.extend(placeholder._backlog)
            self._backlog_msgs += placeholder._backlog_msgs
            self._undelivered.extend(placeholder._undelivered)
            placeholder._backlog, placeholder._backlog_msgs = [], 0
            placeholder._undelivered = []
            return
        if placeholder._backlog:
            with self._wlock:  # (see send_encoded)
                for header, parts in placeholder._backlog:
                    self._enqueue(header, parts)
            placeholder._backlog = []
            placeholder._backlog_msgs = 0
            self._schedule_flush()
        placeholder._undelivered = []  # their messages go out here

    def _report_unsent(self, peer_name: str) -> None:
        """Messages queued while connecting die with the connection: say so, never
        silently (calls among them fail through ``pending``; this covers the rest)."""
        hooks, self._undelivered = self._undelivered, []
        if self._backlog_msgs > len(hooks):
            log.error(
                "%d message(s) queued for %s while connecting were never delivered: %s",
                self._backlog_msgs - len(hooks),
                peer_name,
                self.close_reason,
            )
        self._backlog = []
        self._backlog_msgs = 0
        for hook in hooks:
            hook(self.close_reason)
