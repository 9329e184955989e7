"""Bytes in, frames out: the receive side of the control-plane framing, with no socket.

A :class:`FrameReader` owns one connection's receive buffer. Whoever moves the bytes
(an ``asyncio.BufferedProtocol``, or a test) asks it for a buffer to fill
(:meth:`FrameReader.get_buffer`), says how much arrived
(:meth:`FrameReader.buffer_updated`), and takes out whole frames. Small frames are
parsed out of one reused buffer; a large part is received straight into the buffer it
will live in (the numpy array or tensor it becomes), pooled for reuse, never
concatenated. Every violation of the layout or the limits raises a
:class:`~danaus.errors.ProtocolError` (or :class:`~danaus.errors.AuthenticationError`
for a frame that fails its session tag) naming the limit.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable, Sequence

import msgspec

from ..config import config
from ..errors import AuthenticationError, ProtocolError
from ._frame_tags import LARGE_FRAME, TAG_BYTES, FrameMacs, frame_tag
from ._part_pool import part_pool
from ._wire import MAGIC, MAX_HANDSHAKE_HEADER, MAX_PARTS, PART_LEN, PREFIX, Buffer, Message

__all__ = ["FrameReader"]

#: Receive buffer of an authenticated connection.
RECV_BUFFER = 256 << 10
#: Until a peer has authenticated, its receive buffer holds one handshake frame, no more.
HANDSHAKE_BUFFER = MAX_HANDSHAKE_HEADER + 1024
#: Parts at least this large are received into their own buffer directly.
DIRECT_PART = 64 << 10
#: Parts at least this large are pooled for reuse.
POOLED_PART = 1 << 20
#: A fresh buffer for a part starts this large and doubles as the part's bytes arrive,
#: so a peer's claim of a huge part costs memory only as its bytes really come.
GROW_FROM = 1 << 20
#: calloc'd zeros: extending a buffer from it reads pages that cost no memory
_ZEROS = memoryview(bytes(64 << 20))
_NO_PARTS: list[bytearray] = []  # shared, never mutated: the parts of a part-less frame


def _part_lens(mv: memoryview, offset: int, n: int) -> tuple[int, ...]:
    if n == 0:
        return ()
    if n == 1:
        return PART_LEN.unpack_from(mv, offset)
    return struct.unpack_from(f"<{n}Q", mv, offset)


class FrameReader:
    """The frames of one connection's incoming byte stream, handed to callbacks.

    It starts in handshake mode: headers of at most ``MAX_HANDSHAKE_HEADER`` bytes, no
    parts, each handed undecoded to ``on_handshake(header)``. After :meth:`open` it takes
    ``config`` limits, decodes each header as a :data:`~danaus.actors._wire.Message` for
    ``on_message(msg, parts)`` and, given the session's incoming tag makers, checks the
    tag after every frame. Setting :attr:`paused` in a callback stops the parse (the rest
    waits for :meth:`parse`). ``peer_name`` names the peer in errors.
    """

    def __init__(
        self,
        on_message: Callable[[Message, list[bytearray]], None],
        on_handshake: Callable[[bytes], None],
        peer_name: Callable[[], str] = lambda: "(unknown peer)",
    ) -> None:
        self._on_message = on_message
        self._on_handshake = on_handshake
        self._peer_name = peer_name
        self._decode = msgspec.msgpack.Decoder(Message).decode
        self.opened = False
        #: Set by the owner to stop handing out frames (checked after each one): a full
        #: mailbox holds reading, or the connection closed. What is left waits for
        #: :meth:`parse` once it is cleared.
        self.paused = False
        self._mac_in: FrameMacs | None = None
        self._seq_in = 0
        self._buf = bytearray(HANDSHAKE_BUFFER)
        self._mv = memoryview(self._buf)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0
        # the frame being received: header length (-1: between frames), part lengths,
        # header, parts so far, prefix and part lengths (for its tag)
        self._hlen = -1
        self._lens: tuple[int, ...] = ()
        self._header: bytes | None = None
        self._parts: list[bytearray] = []
        self._head = b""
        # a large part being received into its own buffer
        self._direct: memoryview | None = None
        self._direct_buf: bytearray | None = None
        self._direct_filled = 0
        self._direct_need = 0

    def __repr__(self) -> str:
        mode = "open" if self.opened else "handshake"
        return f"<FrameReader {mode} unread={self._end - self._start} mid_frame={self.mid_frame}>"

    def open(self, mac_in: FrameMacs | None = None) -> None:
        """The peer authenticated: messages from now on, each tagged if ``mac_in``."""
        self.opened = True
        self._mac_in = mac_in

    @property
    def mid_frame(self) -> bool:
        """Has part of a frame arrived, but not all of it?"""
        return self._hlen >= 0 or self._start != self._end

    @property
    def receiving_part(self) -> bool:
        """Is a large part arriving straight into its own buffer?"""
        return self._direct is not None

    def close(self) -> None:
        """Drop the part being received (the connection is gone)."""
        self._direct = None
        self._direct_buf = None

    # ------------------------------------------------------------ bytes in

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes go (``BufferedProtocol.get_buffer``)."""
        if self._direct is not None:
            if self._direct_filled == len(self._direct):
                self._grow_direct()
            return self._direct[self._direct_filled :]
        if self._end == len(self._buf):
            self._compact(0)
        elif len(self._buf) < RECV_BUFFER and self.opened:
            self._compact(RECV_BUFFER)  # authenticated now: a buffer for real traffic
        return self._mv[self._end :]

    def buffer_updated(self, nbytes: int) -> bool:
        """``nbytes`` arrived in the last :meth:`get_buffer`: hand out the frames now whole
        (:meth:`parse`). False while they only went on filling a large part."""
        if self._direct is not None:
            self._direct_filled += nbytes
            if self._direct_filled < self._direct_need:
                return False  # (get_buffer grows the buffer when it is full)
            assert self._direct_buf is not None
            if self._direct_need >= POOLED_PART:
                part_pool.keep(self._direct_buf)
            self._parts.append(self._direct_buf)
            self._direct = None
            self._direct_buf = None
        else:
            self._end += nbytes
        self.parse()
        return True

    def feed(self, data: Buffer) -> None:
        """Copy ``data`` in (for a caller that has bytes rather than a buffer to fill),
        handing out frames as they become whole."""
        view = memoryview(data).cast("B")
        i, n = 0, len(view)
        while i < n:
            buf = self.get_buffer()
            k = min(len(buf), n - i)
            buf[:k] = view[i : i + k]
            self.buffer_updated(k)
            i += k

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

    # ------------------------------------------------------------ frames out

    def parse(self) -> None:
        """Hand every whole frame received to ``on_handshake`` (its header, until
        :meth:`open`) or ``on_message``, until one of them sets :attr:`paused`: the rest
        stays for the next call."""
        if not self.opened and not self._parse_handshake():
            return
        on_message = self._on_message
        unpack = PREFIX.unpack_from
        decode = self._decode
        while True:
            if self._hlen < 0:
                # Fast paths: whole small part-less frames lying in the buffer.
                mv = self._mv
                start, end = self._start, self._end
                max_header = config.max_header_bytes
                if self._mac_in is not None:
                    while end - start >= 12:
                        magic, hlen, nparts = unpack(mv, start)
                        e = start + 12 + hlen
                        if (
                            nparts
                            or magic != MAGIC
                            or 12 + hlen >= LARGE_FRAME
                            or hlen > max_header
                            or end - e < TAG_BYTES
                        ):
                            break  # (the general path below checks, or waits for more)
                        self._check_tag((mv[start:e],), e - start, mv[e : e + TAG_BYTES])
                        try:
                            msg = decode(mv[start + 12 : e].tobytes())
                        except msgspec.DecodeError as ex:
                            raise self._undecodable(ex) from ex
                        start = self._start = e + TAG_BYTES
                        on_message(msg, _NO_PARTS)
                        if self.paused:
                            return
                else:
                    while end - start >= 12:
                        magic, hlen, nparts = unpack(mv, start)
                        if nparts or magic != MAGIC or hlen > max_header or end - start < 12 + hlen:
                            break
                        s = start + 12
                        start = self._start = s + hlen
                        try:
                            msg = decode(mv[s:start].tobytes())
                        except msgspec.DecodeError as ex:
                            raise self._undecodable(ex) from ex
                        on_message(msg, _NO_PARTS)
                        if self.paused:
                            return
                if start == end:
                    self._start = self._end = 0
                    return
            got = self._next_frame()
            if got is None:
                return
            header, parts = got
            try:
                msg = decode(header)
            except msgspec.DecodeError as ex:
                raise self._undecodable(ex) from ex
            on_message(msg, parts)
            if self.paused:
                return

    def _parse_handshake(self) -> bool:
        """Hand handshake frames to ``on_handshake`` until :meth:`open`: True then, False
        while it waits for bytes or is paused."""
        while not self.opened:
            got = self._next_frame()
            if got is None:
                return False
            self._on_handshake(got[0])
            if self.paused:
                return False
        return True

    def _undecodable(self, ex: msgspec.DecodeError) -> ProtocolError:
        return ProtocolError(f"undecodable message header from {self._peer_name()}: {ex}")

    def _next_frame(self) -> tuple[bytes, list[bytearray]] | None:
        """The next whole frame, undecoded, or None until more bytes arrive."""
        if self._direct is not None:
            return None  # a large part is still arriving
        mv = self._mv
        while True:
            start = self._start
            avail = self._end - start
            if self._hlen < 0:
                if avail < 12 or not self._take_prefix(avail):
                    break
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
                if n >= DIRECT_PART:
                    have = min(avail, n)
                    buf = part_pool.reuse(n) if n >= POOLED_PART else None
                    if buf is None:
                        buf = bytearray(max(have, min(n, GROW_FROM)))
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
            header = self._header
            if self._mac_in is not None:
                if avail < TAG_BYTES:
                    if TAG_BYTES > len(self._buf) - self._start:
                        self._compact(TAG_BYTES)
                    break
                self._check_tag(
                    (self._head, header, *self._parts),
                    len(self._head) + len(header) + sum(self._lens),
                    mv[self._start : self._start + TAG_BYTES],
                )
                self._start += TAG_BYTES
            parts = self._parts
            self._hlen = -1
            self._header = None
            self._parts = []
            return header, parts
        if self._start == self._end:
            self._start = self._end = 0
        return None

    def _take_prefix(self, avail: int) -> bool:
        """Check and consume the prefix (magic, lengths) of the next frame, whose first
        12 of ``avail`` bytes lie at ``_start``: False while its part lengths are still
        arriving."""
        mv = self._mv
        magic, hlen, nparts = PREFIX.unpack_from(mv, self._start)
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {bytes(magic)!r} from {self._peer_name()}")
        limit = config.max_header_bytes if self.opened else MAX_HANDSHAKE_HEADER
        if hlen > limit:
            which = "max_header_bytes" if self.opened else "before authentication"
            raise ProtocolError(
                f"frame header of {hlen} bytes exceeds the limit of {limit} ({which})"
            )
        if nparts > MAX_PARTS or (nparts and not self.opened):
            state = "open" if self.opened else "handshake"
            raise ProtocolError(f"frame of {nparts} parts refused in state {state}")
        need = 12 + 8 * nparts
        if avail < need:
            if need > len(self._buf) - self._start:
                self._compact(need)
            return False
        lens = _part_lens(mv, self._start + 12, nparts)
        total = hlen + sum(lens)
        if total > config.max_frame_bytes:
            raise ProtocolError(
                f"frame of {total} bytes exceeds max_frame_bytes={config.max_frame_bytes}"
            )
        if self._mac_in is not None:
            self._head = bytes(mv[self._start : self._start + need])
        self._start += need
        self._hlen = hlen
        self._lens = lens
        self._header = None
        self._parts = []
        return True

    def _check_tag(self, pieces: Sequence[Buffer], size: int, tag: memoryview) -> None:
        """The frame just received (``pieces``, ``size`` bytes) must carry this session's
        tag for its sequence number: else a third party wrote it (or replayed, reordered or
        cut one) on the way."""
        assert self._mac_in is not None
        expected = frame_tag(self._mac_in, self._seq_in, size, pieces)
        self._seq_in += 1
        if not hmac.compare_digest(expected, tag):
            raise AuthenticationError(
                f"a frame from {self._peer_name()} failed authentication (not from the peer "
                "that completed the handshake, or altered on the way): connection closed"
            )
