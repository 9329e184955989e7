"""The write side of a control-plane connection, and the states a connection goes through.

:class:`FrameWriter` is the half of :class:`~danaus.actors._connection.Connection` that
sends: it owns the write queue (messages sent during one loop iteration go out in one
``writelines`` call, or at once past ``config.flush_bytes``), the frames queued while
the handshake runs (and the hooks that report them if they never go out), the session
tags of outgoing frames, and the transport's write flow control. The connection, its
subclass, owns the transport, the state and the reading.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

import msgspec

from ..config import config
from ._frame_tags import TAG_BYTES, FrameMacs, frame_tag
from ._wire import MAGIC, PREFIX, Buffer, Message, frame

__all__ = ["CLOSED", "HANDSHAKE", "OPEN", "FrameWriter", "State"]

log = logging.getLogger("danaus.connection")


class State(enum.Enum):
    """Where a connection is: authenticating, open, or closed for good."""

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


# Module-level aliases: looking up an Enum member on its class is slow on Python 3.11.
HANDSHAKE, OPEN, CLOSED = State.HANDSHAKE, State.OPEN, State.CLOSED


class FrameWriter:
    """Queues, batches, tags and writes the frames of one connection (a mixin of
    :class:`~danaus.actors._connection.Connection`, which sets the attributes below)."""

    loop: asyncio.AbstractEventLoop
    state: State
    transport: asyncio.Transport | None
    close_reason: BaseException | None
    #: reply port id -> rank(s) waiting on this connection (see ``Connection.pending``)
    pending: dict[int, int | list[int]]

    def _init_writer(self) -> None:
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
        wq = self._wq
        if wq and self.transport is not None and self.state is not CLOSED:
            self.bytes_out += self._wbytes
            if len(wq) == 1:
                self.transport.write(wq[0])  # one buffer: write() is cheaper than writelines()
            else:
                self.transport.writelines(wq)
        self._wq = []
        self._wbytes = 0

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

    def _adopt_backlog(self, placeholder: FrameWriter) -> None:
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
