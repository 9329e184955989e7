"""One authenticated control-plane connection: framing, handshake, batched writes.

Reading is an ``asyncio.BufferedProtocol``: small frames are parsed out of one reused
buffer, and a large part is received straight into the buffer it will live in (the
numpy array or tensor it becomes), never concatenated. Writes made during one loop
iteration go out in one ``writelines`` call, or at once past ``config.flush_bytes``.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import logging
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..config import config
from ..errors import AuthenticationError, ProtocolError
from . import _auth
from ._wire import (
    MAGIC,
    MAX_HANDSHAKE_HEADER,
    MAX_PARTS,
    PART_LEN,
    PREFIX,
    Auth,
    Buffer,
    Challenge,
    Handshake,
    Hello,
    Message,
    frame,
)

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("danaus.connection")

_RECV_BUFFER = 256 << 10
#: Length of the tag after each frame on TCP without TLS, and the frame size from which
#: it is an HMAC-SHA256 (below: keyed BLAKE2b).
_TAG_BYTES = 32
_LARGE_FRAME = 256 << 10
#: Until a peer has authenticated, its receive buffer holds one handshake frame, no more.
_HANDSHAKE_BUFFER = MAX_HANDSHAKE_HEADER + 1024
#: Parts at least this large are received into their own buffer directly.
_DIRECT_PART = 64 << 10
_NO_PARTS: list[Any] = []  # shared, never mutated: the parts of a part-less frame
_hs_encode = msgspec.msgpack.Encoder().encode
_hs_decode = msgspec.msgpack.Decoder(Handshake).decode


class State(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


# Module-level aliases: looking up an Enum member on its class is slow on Python 3.11.
HANDSHAKE, OPEN, CLOSED = State.HANDSHAKE, State.OPEN, State.CLOSED


class _PartPool:
    """Keeps large receive buffers for reuse once nothing but the pool refers to them.

    Fresh memory costs a page fault per 4 KiB on first touch (0.5-0.7 GB/s here), so a
    64 MiB part received into reused memory arrives several times faster. Buffers not
    reused for ``idle`` seconds go back to the system (:meth:`trim`, on each heartbeat).
    """

    def __init__(self, max_bytes: int = 512 << 20, idle: float = 10.0) -> None:
        self._bufs: list[bytearray] = []
        self._used: list[float] = []  # when each buffer was last handed out
        self._max = max_bytes
        self._idle = idle

    def reuse(self, n: int) -> bytearray | None:
        """A free pooled buffer of exactly ``n`` bytes, if there is one."""
        bufs = self._bufs
        for i in range(len(bufs)):  # (enumerate's cached tuple would hold a reference)
            b = bufs[i]
            # 3 = this list, the local ``b``, getrefcount's argument.
            if len(b) == n and sys.getrefcount(b) <= 3:
                self._used[i] = time.monotonic()
                return b
        return None

    def keep(self, b: bytearray) -> None:
        """Pool ``b`` (a large buffer just filled) for later parts of its size."""
        if any(x is b for x in self._bufs):
            return
        total = sum(len(x) for x in self._bufs)
        while self._bufs and total + len(b) > self._max:
            total -= len(self._bufs.pop(0))
            self._used.pop(0)
        self._bufs.append(b)
        self._used.append(time.monotonic())

    def trim(self) -> None:
        """Let go of buffers that nobody used lately."""
        if not self._bufs:
            return
        cutoff = time.monotonic() - self._idle
        keep = [i for i, t in enumerate(self._used) if t >= cutoff]
        self._bufs = [self._bufs[i] for i in keep]
        self._used = [self._used[i] for i in keep]


_pool = _PartPool()
#: Parts at least this large are pooled for reuse.
_POOLED_PART = 1 << 20
#: A fresh buffer for a part starts this large and doubles as the part's bytes arrive,
#: so a peer's claim of a huge part costs memory only as its bytes really come.
_GROW_FROM = 1 << 20
#: calloc'd zeros: extending a buffer from it reads pages that cost no memory
_ZEROS = memoryview(bytes(64 << 20))


def _frame_tag(macs: tuple[Any, Any], seq: int, size: int, pieces: Sequence[Buffer]) -> bytes:
    """The tag of the frame made of ``pieces`` (``size`` bytes), number ``seq`` in its
    direction: keyed BLAKE2b for small frames, HMAC-SHA256 for large ones (both sides pick
    by the frame's length); ``macs`` hold the keys, copied per frame."""
    h = macs[size >= _LARGE_FRAME].copy()
    h.update(seq.to_bytes(8, "little"))
    for p in pieces:
        h.update(p)
    digest: bytes = h.digest()
    return digest


def trim_part_pool() -> None:
    """Give idle pooled receive buffers back to the system (called every heartbeat)."""
    _pool.trim()


class Connection(asyncio.BufferedProtocol):
    """A framed, authenticated connection to one peer (a proc or a controller).

    Either side may send: the dialer announces its own listening address, so the
    acceptor routes messages for that address over this same connection.
    """

    def __init__(self, runtime: Runtime, *, dialer: bool, peer: str | None = None) -> None:
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
        self.seen_reads = -1
        self.quiet_since = 0.0
        #: reply port id -> rank of the callee (or the ranks of a cast subtree), for
        #: calls whose reply comes back here; failed if the connection is lost
        self.pending: dict[int, Any] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._decode = msgspec.msgpack.Decoder(Message).decode
        self._nonce = _auth.new_nonce()
        self._peer_nonce = b""
        self._hs_timer: asyncio.TimerHandle | None = None
        self._hs_started = 0.0
        # receive state
        self._buf = bytearray(_HANDSHAKE_BUFFER)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._hlen = -1
        self._lens: tuple[int, ...] = ()
        self._header: bytes | None = None
        self._parts: list[Any] = []
        self._direct: memoryview | None = None
        self._direct_buf: bytearray | None = None
        self._direct_filled = 0
        self._direct_need = 0
        # write state
        self._wq: list[Buffer] = []
        self._wbytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._reading = False  # inside buffer_updated: writes are flushed at its end
        self.write_paused = False
        self._writable_waiters: list[asyncio.Future[None]] = []
        self._read_holders: set[object] = set()
        self._backlog: list[tuple[bytes, Sequence[Buffer]]] = []  # frames while connecting
        #: TCP without TLS: every frame after the handshake carries an HMAC-SHA256 tag
        #: under a session key, over a per-direction sequence number and the frame
        self._tag_frames = False
        #: (keyed BLAKE2b, HMAC-SHA256) holding the outgoing / incoming key, copied per frame
        self._mac_out: tuple[Any, Any] | None = None
        self._mac_in: tuple[Any, Any] | None = None
        self._seq_out = 0
        self._seq_in = 0
        self._head = b""  # prefix and part lengths of the frame being received
        self._backlog_msgs = 0  # messages in _backlog: reported if they are never sent
        self._undelivered: list[Callable[[BaseException | None], None]] = []

    def __repr__(self) -> str:
        side = "dialer" if self.dialer else "acceptor"
        return f"<Connection {side} peer={self.peer} {self.state.value}>"

    # ------------------------------------------------------------ lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        if not self.dialer and not self.rt.admit(self):  # (admit logs it)
            self.state = CLOSED
            self.close_reason = AuthenticationError("too many connections waiting to authenticate")
            self.transport.abort()  # type: ignore[union-attr]
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            n = config.socket_buffer_bytes
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, n)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, n)
            except OSError:
                pass
        if (
            sock is not None
            and sock.family in (socket.AF_INET, socket.AF_INET6)
            and transport.get_extra_info("sslcontext") is None
        ):
            self._tag_frames = True  # TCP without TLS: bind each frame to this session
        if self.dialer:
            self._write_now(frame(_hs_encode(Hello(self._nonce, self.rt.addr))))
        # Both sides: a peer that accepts (or dials) and then says nothing is dropped. The
        # dialer chose its peer, which may merely be busy: it waits as long as for any
        # peer's answer (heartbeat_timeout); the acceptor bounds strangers more tightly.
        self._hs_started = self.loop.time()
        self._hs_timer = self.loop.call_later(self._hs_deadline(), self._handshake_expired)

    def _hs_deadline(self) -> float:
        if self.dialer:
            return max(config.handshake_timeout, config.heartbeat_timeout)
        return config.handshake_timeout

    def _handshake_expired(self) -> None:
        self._hs_timer = None
        if self.state is not HANDSHAKE:
            return
        waited = self.loop.time() - self._hs_started
        if self._unread_bytes_waiting() and waited < self._hs_deadline() + config.heartbeat_timeout:
            # The peer did send: it is our own loop that was too busy to read it yet
            # (timers run before the poll). A busy proc is slow, not hostile: look again
            # shortly, bounded by the liveness timeout.
            self._hs_timer = self.loop.call_later(
                min(0.1, self._hs_deadline()), self._handshake_expired
            )
            return
        self._fail(
            AuthenticationError(
                f"peer {self._peer_name()} did not authenticate within {self._hs_deadline()} s"
            )
        )

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
        if self.state is not CLOSED:
            self.state = CLOSED
            if self.close_reason is None:
                self.close_reason = exc or ConnectionResetError(f"connection to {self.peer} closed")
        self._direct = None
        self._direct_buf = None
        self._report_unsent()
        self.resume_writing()  # wake writers: their sends now fail
        self.rt.connection_lost(self)

    def never_opened(self, exc: BaseException) -> None:
        """The peer could not be reached (a refused dial, a proc that never came up):
        this connection is closed, and what was queued on it is reported."""
        self.state = CLOSED
        self.close_reason = exc
        self._report_unsent()
        self.rt.connection_lost(self)

    def _report_unsent(self) -> None:
        """Messages queued while connecting die with the connection: say so, never
        silently (calls among them fail through ``pending``; this covers the rest)."""
        hooks, self._undelivered = self._undelivered, []
        if self._backlog_msgs > len(hooks):
            log.error(
                "%d message(s) queued for %s while connecting were never delivered: %s",
                self._backlog_msgs - len(hooks),
                self._peer_name(),
                self.close_reason,
            )
        self._backlog = []
        self._backlog_msgs = 0
        for hook in hooks:
            hook(self.close_reason)

    def _peer_name(self) -> str:
        if self.peer:
            return self.peer
        if self.transport is not None:
            name = self.transport.get_extra_info("peername")
            if name:
                return str(name)
        return "(unknown peer)"

    def _fail(self, exc: BaseException) -> None:
        """Close this connection because of ``exc`` (logged); the proc keeps serving."""
        if self.state is CLOSED:
            return
        if isinstance(exc, AuthenticationError):
            log.error("refused connection: %s", exc)
        elif isinstance(exc, ProtocolError):
            log.error("closing connection from %s: %s", self._peer_name(), exc)
        self.state = CLOSED
        self.close_reason = exc
        if self.transport is not None:
            self.transport.abort()
        else:
            self.never_opened(exc)

    def close(self) -> None:
        """Flush what is queued, then close."""
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

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
        self._flush()
        while self.write_paused and self.state is not CLOSED:
            w = self.loop.create_future()
            self._writable_waiters.append(w)
            await w

    def hold_reading(self, holder: object) -> None:
        """Stop reading from the peer until every holder lets go (a full mailbox)."""
        if not self._read_holders and self.transport is not None:
            self.transport.pause_reading()
        self._read_holders.add(holder)

    def release_reading(self, holder: object) -> None:
        if holder not in self._read_holders:
            return
        self._read_holders.discard(holder)
        if not self._read_holders and self.transport is not None and self.state is not CLOSED:
            self.transport.resume_reading()
            self.loop.call_soon(self._resume_parse)

    def _resume_parse(self) -> None:
        """Parse what stayed in the buffer while reading was held."""
        if self._read_holders or self.state is CLOSED or self._direct is not None:
            return
        self.buffer_updated(0)

    def adopt(self, placeholder: Connection) -> None:
        """Take over frames and pending replies queued on a placeholder for this peer."""
        self.pending.update(placeholder.pending)
        placeholder.pending.clear()
        if placeholder._backlog:
            for header, parts in placeholder._backlog:
                self._enqueue(header, parts)
            placeholder._backlog = []
            placeholder._backlog_msgs = 0
            self._schedule_flush()
        placeholder._undelivered = []  # their messages go out here

    # ------------------------------------------------------------ writing

    def send(self, msg: Any, parts: Sequence[Buffer] = ()) -> bool:
        """Queue one message; False when the connection is closed."""
        return self.send_encoded(self._encoder.encode(msg), parts)

    def send_reported(
        self, msg: Any, parts: Sequence[Buffer], undelivered: Callable[[BaseException | None], None]
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
                self._flush()
                return True
            if parts or self._mac_out is not None:
                self._enqueue(header, parts)
            else:
                data = PREFIX.pack(MAGIC, len(header), 0) + header
                if not self._wq and not self.pending and not self._reading:
                    # A lone message (nothing queued, nothing in flight): send it now
                    # rather than a loop turn later. Bursts still go out batched.
                    self.transport.write(data)  # type: ignore[union-attr]
                    return True
                self._wq.append(data)
                self._wbytes += len(data)
            if self._wbytes >= config.flush_bytes:
                self._flush()
            elif self._flush_handle is None and not self._reading:
                self._flush_handle = self.loop.call_soon(self._flush)
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
            bufs.append(_frame_tag(self._mac_out, self._seq_out, size, bufs))
            self._seq_out += 1
            size += _TAG_BYTES
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
            self._flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        wq = self._wq
        if wq and self.transport is not None and self.state is not CLOSED:
            if len(wq) == 1:
                self.transport.write(wq[0])  # one buffer: write() is cheaper than writelines()
            else:
                self.transport.writelines(wq)
        self._wq = []
        self._wbytes = 0

    def _write_now(self, bufs: list[Buffer]) -> None:
        assert self.transport is not None
        self.transport.writelines(bufs)

    def _open(self) -> None:
        self.state = OPEN
        self.was_open = True
        if self._hs_timer is not None:
            self._hs_timer.cancel()
            self._hs_timer = None
        if self._tag_frames:
            d2a, a2d = _auth.frame_keys(
                self.rt.key,
                *(
                    (self._nonce, self._peer_nonce)
                    if self.dialer
                    else (self._peer_nonce, self._nonce)
                ),
            )
            out_key, in_key = (d2a, a2d) if self.dialer else (a2d, d2a)
            # Keyed BLAKE2b for small frames (1 µs each), HMAC-SHA256 for large ones (faster
            # per byte here); both sides pick by the frame's length.
            self._mac_out = (
                hashlib.blake2b(key=out_key, digest_size=_TAG_BYTES),
                hmac.new(out_key, digestmod=hashlib.sha256),
            )
            self._mac_in = (
                hashlib.blake2b(key=in_key, digest_size=_TAG_BYTES),
                hmac.new(in_key, digestmod=hashlib.sha256),
            )
        if self._backlog:
            for header, parts in self._backlog:
                self._enqueue(header, parts)
            self._backlog = []
            self._backlog_msgs = 0
            self._flush()
        self._undelivered = []
        self.rt.connection_open(self)

    # ------------------------------------------------------------ reading

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct is not None:
            if self._direct_filled == len(self._direct):
                self._grow_direct()
            return self._direct[self._direct_filled :]
        if self._end == len(self._buf):
            self._compact(0)
        elif len(self._buf) < _RECV_BUFFER and self.state is OPEN:
            self._compact(_RECV_BUFFER)  # authenticated now: a buffer for real traffic
        return self._mv[self._end :]

    def _grow_direct(self) -> None:
        """The part being received filled its buffer and more is due: double it."""
        assert self._direct is not None and self._direct_buf is not None
        buf = self._direct_buf
        k = min(len(buf), self._direct_need - len(buf), len(_ZEROS))
        self._direct.release()
        try:
            buf += _ZEROS[:k]  # realloc: large blocks move by remapping, not copying
        except BufferError:  # a view of it is still alive somewhere: copy instead
            buf = bytearray(buf)
            buf += _ZEROS[:k]
            self._direct_buf = buf
        self._direct = memoryview(buf)

    def _compact(self, need: int) -> None:
        """Move unread bytes to the front; grow the buffer if ``need`` bytes will not fit."""
        unread = self._end - self._start
        if max(need, unread + 1) > len(self._buf):
            buf = bytearray(max(need, 2 * len(self._buf)))
            buf[:unread] = self._mv[self._start : self._end]
            self._buf = buf
            self._mv = memoryview(buf)
        elif self._start:
            self._mv[:unread] = self._mv[self._start : self._end]
        self._start = 0
        self._end = unread

    def buffer_updated(self, nbytes: int) -> None:
        if self.state is CLOSED:
            return
        self.reads += 1  # the heartbeat sees whether the peer said anything lately
        try:
            if self._direct is not None:
                self._direct_filled += nbytes
                if self._direct_filled < self._direct_need:
                    return  # (get_buffer grows the buffer when it is full)
                if self._direct_need >= _POOLED_PART:
                    _pool.keep(self._direct_buf)  # type: ignore[arg-type]
                self._parts.append(self._direct_buf)
                self._direct = None
                self._direct_buf = None
            else:
                self._end += nbytes
            self._reading = True
            self._parse()
        except ProtocolError as e:
            self._fail(e)
            return
        finally:
            self._reading = False
        # Replies made while handling what just arrived go out now, in one write.
        if self._wq:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()

    def eof_received(self) -> bool | None:
        if self._hlen >= 0 or self._start != self._end:
            self._fail(
                ProtocolError(f"peer {self._peer_name()} closed mid-frame (truncated frame)")
            )
        return None

    def _parse(self) -> None:
        mv = self._mv
        unpack = PREFIX.unpack_from
        if self._hlen < 0 and self.state is OPEN and self._mac_in is not None:
            # Fast path of a tagged connection: whole small part-less frames and their tags.
            start, end = self._start, self._end
            decode, dispatch = self._decode, self.rt.dispatch
            while end - start >= 12:
                magic, hlen, nparts = unpack(mv, start)
                e = start + 12 + hlen
                if (
                    nparts
                    or magic != MAGIC
                    or 12 + hlen >= _LARGE_FRAME
                    or hlen > config.max_header_bytes
                    or end - e < _TAG_BYTES
                ):
                    break  # (the general path below checks, or waits for more)
                self._check_tag((mv[start:e],), e - start, mv[e : e + _TAG_BYTES])
                try:
                    msg = decode(mv[start + 12 : e].tobytes())
                except msgspec.DecodeError as ex:
                    raise ProtocolError(
                        f"undecodable message header from {self._peer_name()}: {ex}"
                    ) from ex
                start = self._start = e + _TAG_BYTES
                dispatch(self, msg, _NO_PARTS)
                if self.state is not OPEN or self._read_holders:
                    return
            if start == end:
                self._start = self._end = 0
                return
        elif self._hlen < 0 and self.state is OPEN:
            # Fast path: whole part-less messages lying in the buffer.
            start, end = self._start, self._end
            decode, dispatch = self._decode, self.rt.dispatch
            max_header = config.max_header_bytes
            while end - start >= 12:
                magic, hlen, nparts = unpack(mv, start)
                if nparts or magic != MAGIC or hlen > max_header or end - start < 12 + hlen:
                    break
                s = start + 12
                start = self._start = s + hlen
                try:
                    msg = decode(mv[s:start].tobytes())
                except msgspec.DecodeError as e:
                    raise ProtocolError(
                        f"undecodable message header from {self._peer_name()}: {e}"
                    ) from e
                dispatch(self, msg, _NO_PARTS)
                if self.state is not OPEN or self._read_holders:
                    return  # closed, or a full mailbox: the rest waits in the buffer
            if start == end:
                self._start = self._end = 0
                return
        while self.state is not CLOSED:
            start = self._start
            avail = self._end - start
            if self._hlen < 0:
                if avail < 12:
                    break
                magic, hlen, nparts = unpack(mv, start)
                if magic != MAGIC:
                    raise ProtocolError(
                        f"bad frame magic {bytes(magic)!r} from {self._peer_name()}"
                    )
                limit = config.max_header_bytes if self.state is OPEN else MAX_HANDSHAKE_HEADER
                if hlen > limit:
                    raise ProtocolError(
                        f"frame header of {hlen} bytes exceeds the limit of {limit}"
                    )
                if nparts > MAX_PARTS or (nparts and self.state is not OPEN):
                    raise ProtocolError(
                        f"frame of {nparts} parts refused in state {self.state.value}"
                    )
                need = 12 + 8 * nparts
                if avail < need:
                    if need > len(self._buf) - self._start:
                        self._compact(need)
                        mv = self._mv
                    break
                lens = struct_lens(mv, self._start + 12, nparts)
                total = hlen + sum(lens)
                if total > config.max_frame_bytes:
                    raise ProtocolError(
                        f"frame of {total} bytes exceeds max_frame_bytes={config.max_frame_bytes}"
                    )
                if self._mac_in is not None and self.state is OPEN:
                    self._head = bytes(mv[self._start : self._start + need])
                self._start += need
                self._hlen = hlen
                self._lens = lens
                self._header = None
                self._parts = []
                continue
            if self._header is None:
                hlen = self._hlen
                if avail < hlen:
                    if hlen > len(self._buf) - self._start:
                        # Grow as the header's bytes arrive (doubling), not by its claim.
                        self._compact(min(hlen, 2 * len(self._buf)))
                        mv = self._mv
                    break
                self._header = bytes(mv[self._start : self._start + hlen])
                self._start += hlen
                continue
            i = len(self._parts)
            if i < len(self._lens):
                n = self._lens[i]
                if n >= _DIRECT_PART:
                    have = min(avail, n)
                    buf = _pool.reuse(n) if n >= _POOLED_PART else None
                    if buf is None:
                        buf = bytearray(max(have, min(n, _GROW_FROM)))
                    buf[:have] = mv[self._start : self._start + have]
                    self._start += have
                    if have == n:
                        self._parts.append(buf)
                        continue
                    self._direct_buf = buf
                    self._direct = memoryview(buf)
                    self._direct_filled = have
                    self._direct_need = n
                    break
                if avail < n:
                    if n > len(self._buf) - self._start:
                        self._compact(n)
                        mv = self._mv
                    break
                self._parts.append(bytearray(mv[self._start : self._start + n]))
                self._start += n
                continue
            if self._mac_in is not None and self.state is OPEN:
                if avail < _TAG_BYTES:
                    if _TAG_BYTES > len(self._buf) - self._start:
                        self._compact(_TAG_BYTES)
                        mv = self._mv
                    break
                assert self._header is not None
                self._check_tag(
                    (self._head, self._header, *self._parts),
                    len(self._head) + len(self._header) + sum(self._lens),
                    mv[self._start : self._start + _TAG_BYTES],
                )
                self._start += _TAG_BYTES
            header, parts = self._header, self._parts
            self._hlen = -1
            self._header = None
            self._parts = []
            if self.state is OPEN:
                try:
                    msg = self._decode(header)
                except msgspec.DecodeError as e:
                    raise ProtocolError(
                        f"undecodable message header from {self._peer_name()}: {e}"
                    ) from e
                self.rt.dispatch(self, msg, parts)
                if self._read_holders:
                    return
            else:
                self._handshake(header)
        if self._start == self._end:
            self._start = self._end = 0

    def _check_tag(self, pieces: Sequence[Buffer], size: int, tag: memoryview) -> None:
        """The frame just received (``pieces``, ``size`` bytes) must carry this session's
        tag for its sequence number: else a third party wrote it (or replayed, reordered or
        cut one) on the way."""
        assert self._mac_in is not None
        expected = _frame_tag(self._mac_in, self._seq_in, size, pieces)
        self._seq_in += 1
        if not hmac.compare_digest(expected, tag):
            raise AuthenticationError(
                f"a frame from {self._peer_name()} failed authentication (not from the peer "
                "that completed the handshake, or altered on the way): connection closed"
            )

    # ------------------------------------------------------------ handshake

    def _handshake(self, header: bytes) -> None:
        try:
            msg = _hs_decode(header)
        except msgspec.DecodeError as e:
            raise AuthenticationError(
                f"peer {self._peer_name()} sent an undecodable handshake: {e}"
            ) from e
        key = self.rt.key
        if not self.dialer and isinstance(msg, Hello) and not self._peer_nonce:
            if len(msg.nonce) != _auth.NONCE_BYTES:
                raise AuthenticationError(
                    f"peer {self._peer_name()} sent a {len(msg.nonce)}-byte nonce "
                    f"(expected {_auth.NONCE_BYTES})"
                )
            self._peer_nonce = msg.nonce
            self.peer = msg.addr
            mac = _auth.proof(key, b"acceptor", msg.nonce, self._nonce)
            self._write_now(frame(_hs_encode(Challenge(self._nonce, mac))))
        elif self.dialer and isinstance(msg, Challenge) and not self._peer_nonce:
            if len(msg.nonce) != _auth.NONCE_BYTES or not _auth.verify(
                key, b"acceptor", self._nonce, msg.nonce, msg.mac
            ):
                raise AuthenticationError(f"peer {self.peer} failed to prove the job key")
            self._peer_nonce = msg.nonce
            self._write_now(
                frame(_hs_encode(Auth(_auth.proof(key, b"dialer", msg.nonce, self._nonce))))
            )
            self._open()
        elif not self.dialer and isinstance(msg, Auth) and self._peer_nonce:
            if not _auth.verify(key, b"dialer", self._nonce, self._peer_nonce, msg.mac):
                raise AuthenticationError(
                    f"peer {self._peer_name()} failed to prove the job key (wrong key?)"
                )
            self._open()
        else:
            raise AuthenticationError(
                f"peer {self._peer_name()} sent {type(msg).__name__} out of turn in the handshake"
            )


def struct_lens(mv: memoryview, offset: int, n: int) -> tuple[int, ...]:
    if n == 0:
        return ()
    if n == 1:
        return PART_LEN.unpack_from(mv, offset)
    return struct.unpack_from(f"<{n}Q", mv, offset)
