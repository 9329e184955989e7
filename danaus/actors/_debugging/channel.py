"""A debugger session's connection to the spawner, with no event loop.

The paused thread (maybe the proc's event loop itself, stopped at a pdb prompt) dials the
spawner with a blocking socket and speaks the control plane's protocol over it: the same
handshake (:class:`~danaus.actors._handshake.HandshakeMachine`), frames
(:class:`~danaus.actors._frame_reader.FrameReader`, tagged on TCP without TLS) and job key,
carrying :class:`~danaus.actors._wire.DebugOpen`, ``DebugOutput`` and ``DebugClose`` up and
``DebugInput`` and ``DebugDetach`` down. A reader thread answers the spawner's pings, so
the session lives while pdb steps through slow code, and gives up on a spawner silent
past ``heartbeat_timeout``.
"""

from __future__ import annotations

import enum
import logging
import queue
import socket
import threading
import time

import msgspec

from ...config import config
from .._address import parse_addr, tls_context
from .._frame_reader import FrameReader
from .._frame_tags import FrameMacs, frame_macs, frame_tag
from .._handshake import HandshakeMachine
from .._wire import Buffer, DebugDetach, DebugInput, DebugOpen, Message, Ping, Pong, frame

__all__ = ["ChannelState", "DebugChannel", "Nothing"]

log = logging.getLogger("danaus.debug")


class ChannelState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class Nothing(enum.Enum):
    """What the reader thread hands the paused thread instead of a line."""

    DETACH = "detach"  # nobody will attach (the attacher went away, or continue-all)
    GONE = "gone"  # the channel is closed


class DebugChannel:
    """One session's connection to the spawner: a blocking socket, written by the paused
    thread (under a lock) and read by a daemon thread that answers pings and queues the
    lines typed. The reader gives up on a spawner silent past ``heartbeat_timeout``."""

    def __init__(self, target: str, key: bytes, announce: str) -> None:
        self.target = target
        self.state = ChannelState.NEW
        #: lines typed at the spawner, or why none will come
        self.lines: queue.SimpleQueue[str | Nothing] = queue.SimpleQueue()
        self._key = key
        self._announce = announce  # the dialer's "address" in the handshake: this session's
        self._sock: socket.socket | None = None  # (an ssl.SSLSocket with TLS)
        self._wlock = threading.Lock()
        self._encode = msgspec.msgpack.Encoder().encode
        self._mac_out: FrameMacs | None = None
        self._seq_out = 0
        self._inbox: list[Message] = []
        self._frame_reader = FrameReader(
            lambda msg, parts: self._inbox.append(msg), self._on_handshake, lambda: target
        )
        self._hs = HandshakeMachine(key, dialer=True, addr=announce, peer_name=lambda: target)
        self._reader: threading.Thread | None = None
        self._last_read = time.monotonic()

    def __repr__(self) -> str:
        return f"<DebugChannel to {self.target} {self.state.value}>"

    def open(self, first: DebugOpen) -> None:
        """Dial, authenticate, send ``first``, start reading. Raises OSError (or
        AuthenticationError) when the spawner cannot be reached."""
        family, where = parse_addr(self.target)
        if family == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            sock = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET)
        sock.settimeout(config.connect_timeout)
        tagged = False
        try:
            sock.connect(where)
            if family == "tcp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                ctx = tls_context(server=False)
                if ctx is not None:
                    sock = ctx.wrap_socket(sock, server_hostname=where[0])
                else:
                    tagged = True  # as a Connection: TCP without TLS tags every frame
            self._sock = sock
            self._sendall(self._hs.start())
            deadline = time.monotonic() + self._hs.deadline
            while not self._hs.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.target} did not finish the handshake")
                sock.settimeout(left)
                if not self._recv():
                    raise ConnectionError(f"{self.target} closed the connection in the handshake")
        except BaseException:
            sock.close()
            raise
        if tagged:
            out_key, in_key = self._hs.frame_keys()
            self._mac_out = frame_macs(out_key)
            self._frame_reader.open(frame_macs(in_key))
        else:
            self._frame_reader.open()
        self.state = ChannelState.OPEN
        self.send(first)
        sock.settimeout(config.heartbeat_interval)
        self._reader = threading.Thread(target=self._read, name="danaus-debug", daemon=True)
        self._reader.start()

    def _on_handshake(self, header: bytes) -> None:
        reply = self._hs.receive(header)
        if reply:
            self._sendall(reply)

    def _sendall(self, bufs: list[Buffer]) -> None:
        assert self._sock is not None
        self._sock.sendall(b"".join(bytes(b) for b in bufs))

    def _recv(self) -> bool:
        assert self._sock is not None
        n = self._sock.recv_into(self._frame_reader.get_buffer())
        if n == 0:
            return False
        self._last_read = time.monotonic()
        self._frame_reader.buffer_updated(n)
        return True

    def send(self, msg: Message) -> bool:
        """Send one message; False once the channel is closed or broken."""
        if self.state is not ChannelState.OPEN:
            return False
        bufs = frame(self._encode(msg))
        with self._wlock:
            if self._mac_out is not None:
                size = sum(memoryview(b).nbytes for b in bufs)
                bufs.append(frame_tag(self._mac_out, self._seq_out, size, bufs))
                self._seq_out += 1
            try:
                self._sendall(bufs)
            except OSError:
                self._end()
                return False
        return True

    def _read(self) -> None:
        """The reader thread: lines to the queue, pongs to pings, until the end."""
        try:
            while self.state is ChannelState.OPEN:
                try:
                    if not self._recv():
                        break  # the spawner closed it (exited, or dropped the session)
                except TimeoutError:
                    quiet = time.monotonic() - self._last_read
                    if quiet > config.heartbeat_timeout:
                        log.warning("%s did not answer for %.0f s: going on", self.target, quiet)
                        break
                    self.send(Ping())
                    continue
                inbox, self._inbox = self._inbox, []
                for msg in inbox:
                    match msg:
                        case DebugInput(line=line):
                            self.lines.put(line)
                        case DebugDetach():
                            self.lines.put(Nothing.DETACH)
                        case Ping():
                            self.send(Pong())
                        case _:
                            pass  # a Pong: its arrival counted
        except Exception as e:  # a broken socket or a bad frame: the session is over
            if self.state is ChannelState.OPEN:
                log.warning("the debugger session to %s broke: %s", self.target, e)
        finally:
            self._end()

    def _end(self) -> None:
        if self.state is ChannelState.OPEN:
            self.state = ChannelState.CLOSED
            self.lines.put(Nothing.GONE)
            try:
                if self._sock is not None:
                    self._sock.shutdown(socket.SHUT_RDWR)  # (wakes the reader)
            except OSError:
                pass

    def close(self, last: Message) -> None:
        """Send ``last``, close, and let the reader thread end (bounded)."""
        self.send(last)
        self._end()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(config.heartbeat_interval + 1.0)
        if self._sock is not None:
            self._sock.close()
