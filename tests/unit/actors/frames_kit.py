"""What the frame and handshake tests share: frames built by hand (``frame`` from _wire,
tags from ``frame_tag``), a frame reader fed bytes directly and what it handed out, and a
stream of frames to feed it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from danaus.actors._frame_reader import FrameReader
from danaus.actors._frame_tags import FrameMacs, frame_macs, frame_tag
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import Buffer, Call, Handshake, Message, StopProc, frame

KEY = b"k" * 32
WRONG_KEY = b"w" * 32

_encode = msgspec.msgpack.Encoder().encode
_decode_handshake = msgspec.msgpack.Decoder(Handshake).decode


def joined(bufs: Sequence[Buffer]) -> bytes:
    return b"".join(bytes(b) for b in bufs)


def call(reply: int, method: str = "ping") -> Call:
    return Call("actor", method, reply, encode_plain([[], {}]))


def wire(msg: object, parts: Sequence[Buffer] = ()) -> bytes:
    """One whole untagged frame as bytes, as a peer puts it on the socket."""
    return joined(frame(_encode(msg), parts))


def raw_frame(header: bytes, parts: Sequence[Buffer] = ()) -> bytes:
    return joined(frame(header, parts))


class Tagger:
    """The sending side of a tagged session: frames with their tags, in sequence."""

    def __init__(self, key: bytes = KEY) -> None:
        self.macs: FrameMacs = frame_macs(key)
        self.seq = 0

    def __call__(self, data: bytes) -> bytes:
        tag = frame_tag(self.macs, self.seq, len(data), [data])
        self.seq += 1
        return data + tag


class Sink:
    """A frame reader and what it handed out; ``stop`` makes each callback pause it (as a
    full mailbox does)."""

    def __init__(self) -> None:
        self.reader = FrameReader(self.on_message, self.on_handshake, lambda: "peer-x")
        self.got: list[tuple[Any, list[bytearray]]] = []
        self.headers: list[bytes] = []
        self.stop = False

    def on_message(self, msg: Message, parts: list[bytearray]) -> None:
        assert all(isinstance(p, bytearray) for p in parts)  # writable: arrays live on them
        self.got.append((msg, list(parts)))
        self.reader.paused = self.stop

    def on_handshake(self, header: bytes) -> None:
        self.headers.append(header)
        self.reader.paused = self.stop

    def feed(self, data: bytes) -> list[tuple[Any, list[bytes]]]:
        """Feed ``data``; the frames it completed."""
        self.reader.feed(data)
        return self.take()

    def take(self) -> list[tuple[Any, list[bytes]]]:
        got, self.got = self.got, []
        return [(m, [bytes(p) for p in parts]) for m, parts in got]


def opened(tagged: bool = False) -> Sink:
    sink = Sink()
    sink.reader.open(frame_macs(KEY) if tagged else None)
    return sink


def replies(frames: list[tuple[Any, list[bytes]]]) -> list[int]:
    return [m.reply for m, _ in frames]


PARTS = [b"a" * 100, b"", bytes(range(256)) * 300, b"b" * 5]  # 76,800 bytes: received direct
STREAM = [
    (call(1), []),
    (call(2), PARTS),
    (StopProc(3), []),
    (call(4, "m" * 5000), [b"tiny"]),
    (call(5), []),
]


def stream(tagger: Tagger | None = None) -> bytes:
    return b"".join((tagger or bytes)(wire(m, p)) for m, p in STREAM)


def expected() -> list[tuple[Any, list[bytes]]]:
    return [(m, list(p)) for m, p in STREAM]
