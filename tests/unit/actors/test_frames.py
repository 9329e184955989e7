"""The frame reader (danaus.actors._frames) and the handshake state machine
(danaus.actors._handshake), fed bytes directly: no socket, no loop.

Frames are built by hand (``frame`` from _wire, tags from ``frame_tag``), so these tests
check the wire layout and its limits, not danaus talking to danaus.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from danaus.actors import _auth
from danaus.actors._frame_tags import TAG_BYTES, FrameMacs, frame_macs, frame_tag
from danaus.actors._frames import FrameReader
from danaus.actors._handshake import HandshakeMachine, HandshakeState
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import (
    MAGIC,
    MAX_HANDSHAKE_HEADER,
    MAX_PARTS,
    PART_LEN,
    PREFIX,
    Auth,
    Buffer,
    Call,
    Challenge,
    Handshake,
    Hello,
    Message,
    StopProc,
    frame,
)
from danaus.config import config
from danaus.errors import AuthenticationError, ProtocolError

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


# ---------------------------------------------------------------- whole frames


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "tagged"])
def test_many_frames_in_one_feed(tagged: bool) -> None:
    sink = opened(tagged)

    assert sink.feed(stream(Tagger() if tagged else None)) == expected()
    assert not sink.reader.mid_frame


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "tagged"])
def test_frames_split_at_every_byte_boundary(tagged: bool) -> None:
    first = (Tagger() if tagged else None, wire(call(1)), wire(call(2), [b"xy", b"z" * 300]))
    tagger = first[0]
    data = b"".join((tagger or bytes)(f) for f in first[1:])
    want = [(call(1), []), (call(2), [b"xy", b"z" * 300])]
    for cut in range(len(data) + 1):
        sink = opened(tagged)
        got = sink.feed(data[:cut])
        got += sink.feed(data[cut:])
        assert got == want, f"split at byte {cut}"
        assert not sink.reader.mid_frame


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "tagged"])
def test_frames_fed_one_byte_at_a_time(tagged: bool) -> None:
    sink = opened(tagged)
    got = []

    for b in stream(Tagger() if tagged else None):
        got += sink.feed(bytes([b]))

    assert got == expected()


def test_out_of_band_parts_of_every_size_arrive_whole_and_writable() -> None:
    small, direct, pooled = b"s" * 10, os.urandom(200 << 10), os.urandom(3 << 20)
    sink = opened()

    got = sink.feed(wire(call(7), [small, direct, b"", pooled]) + wire(call(8)))

    assert got == [(call(7), [small, direct, b"", pooled]), (call(8), [])]


def test_a_large_part_is_received_straight_into_its_own_buffer() -> None:
    part = os.urandom(1 << 20)
    data = wire(call(7), [part])
    head = len(data) - len(part)
    sink = opened()
    assert sink.feed(data[: head + 10]) == []
    assert sink.reader.receiving_part

    # The buffer offered now is the part's own: no copy after the socket's.
    view = sink.reader.get_buffer()
    view[: len(part) - 10] = part[10:]
    assert sink.reader.buffer_updated(len(part) - 10)
    [(msg, [got])] = sink.got
    assert view.obj is got  # the very buffer the bytes were received into
    assert msg == call(7) and bytes(got) == part
    assert not sink.reader.receiving_part


def test_a_claimed_huge_part_costs_memory_only_as_its_bytes_arrive() -> None:
    sink = opened()
    header = _encode(call(9))
    sink.feed(PREFIX.pack(MAGIC, len(header), 1) + PART_LEN.pack(1 << 30) + header)

    assert sink.feed(b"x" * (3 << 20)) == []
    assert len(sink.reader.get_buffer()) + (3 << 20) <= 8 << 20


def test_buffer_updated_says_whether_a_frame_may_be_whole() -> None:
    sink = opened()
    assert sink.feed(wire(call(7), [b"p" * (100 << 10)])[:-1000]) == []
    reader = sink.reader
    view = reader.get_buffer()
    view[:500] = b"p" * 500

    assert reader.buffer_updated(500) is False  # only more of the part
    view = reader.get_buffer()
    view[:500] = b"p" * 500
    assert reader.buffer_updated(500) is True
    assert replies(sink.take()) == [7]


def test_stopping_early_leaves_the_rest_for_the_next_call() -> None:
    """A full mailbox holds reading: what follows stays in the buffer, in order."""
    sink = opened()
    sink.stop = True

    assert replies(sink.feed(wire(call(1)) + wire(call(2), [b"p"]) + wire(call(3)))) == [1]
    assert sink.reader.paused and sink.reader.mid_frame
    sink.reader.paused = False
    sink.reader.parse()
    assert replies(sink.take()) == [2]
    sink.stop = False
    sink.reader.paused = False
    sink.reader.parse()
    assert replies(sink.take()) == [3]
    assert not sink.reader.mid_frame


def test_frames_with_tags_of_both_kinds_pass() -> None:
    """Small frames are tagged with keyed BLAKE2b, large ones with HMAC-SHA256."""
    tag = Tagger()
    sink = opened(tagged=True)
    big = os.urandom(400 << 10)

    got = sink.feed(
        tag(wire(call(1))) + tag(wire(call(2), [big])) + tag(wire(call(3, "m" * (300 << 10))))
    )

    assert replies(got) == [1, 2, 3]


# ---------------------------------------------------------------- refused input


def refused(sink: Sink, data: bytes, error: type[Exception] = ProtocolError) -> str:
    with pytest.raises(error) as info:
        sink.feed(data)
    return str(info.value)


def test_bad_magic_is_refused_naming_the_peer() -> None:
    assert refused(opened(), b"GET / HTTP/1.1\r\n") == "bad frame magic b'GET ' from peer-x"


def test_header_over_max_header_bytes_is_refused_from_the_prefix_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "max_header_bytes", 1024)

    msg = refused(opened(), PREFIX.pack(MAGIC, 1025, 0))

    assert msg == "frame header of 1025 bytes exceeds the limit of 1024 (max_header_bytes)"


def test_handshake_header_over_its_limit_is_refused() -> None:
    msg = refused(Sink(), PREFIX.pack(MAGIC, MAX_HANDSHAKE_HEADER + 1, 0))

    assert msg.endswith(f"exceeds the limit of {MAX_HANDSHAKE_HEADER} (before authentication)")


def test_frame_over_max_frame_bytes_is_refused_before_its_parts_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "max_frame_bytes", 1 << 20)
    data = PREFIX.pack(MAGIC, 10, 2) + PART_LEN.pack(1 << 19) + PART_LEN.pack(1 << 19)

    msg = refused(opened(), data)

    assert msg == f"frame of {(1 << 20) + 10} bytes exceeds max_frame_bytes={1 << 20}"


def test_frame_with_too_many_parts_is_refused() -> None:
    msg = refused(opened(), PREFIX.pack(MAGIC, 10, MAX_PARTS + 1))

    assert msg == f"frame of {MAX_PARTS + 1} parts refused in state open"


def test_parts_before_the_handshake_are_refused() -> None:
    msg = refused(Sink(), wire(Hello(os.urandom(16), "unix:@x"), [b"x"]))

    assert msg == "frame of 1 parts refused in state handshake"


@pytest.mark.parametrize("parts", [[], [b"p"]], ids=["part-less", "with-parts"])
@pytest.mark.parametrize(
    "header",
    [
        b"\xc1",  # never valid msgpack
        b"",
        _encode([99, "unknown tag"]),
        _encode(call(1))[:-2],  # truncated
        _encode(Hello(b"n" * 16, "unix:@x")),  # a handshake message after the handshake
        b"\x95\x10\xa2\xff\xfe\xa1m\x01\xc0",  # a Call whose actor name is not UTF-8
    ],
    ids=["bad-msgpack", "empty", "unknown-tag", "truncated", "hello", "not-utf8"],
)
def test_undecodable_header_is_refused(header: bytes, parts: list[bytes]) -> None:
    msg = refused(opened(), raw_frame(header, parts) + wire(call(2)))

    assert msg.startswith("undecodable message header from peer-x: ")


def test_non_utf8_text_is_refused_even_inside_a_well_formed_frame() -> None:
    good = _encode(call(1))
    bad = good.replace(b"actor", b"act\xffr")
    assert len(bad) == len(good)

    assert "Invalid UTF-8" in refused(opened(), raw_frame(bad))


@pytest.mark.parametrize("where", ["small", "with-parts", "large"])
def test_a_wrong_tag_is_refused(where: str) -> None:
    data = {
        "small": wire(call(1)),
        "with-parts": wire(call(1), [b"p" * 10]),
        "large": wire(call(1), [b"p" * (300 << 10)]),
    }[where]
    tagged = Tagger()(data)
    forged = tagged[:-1] + bytes([tagged[-1] ^ 1])

    msg = refused(opened(tagged=True), forged, AuthenticationError)

    assert "a frame from peer-x failed authentication" in msg


@pytest.mark.parametrize(
    "attack",
    ["untagged", "other-key", "replayed", "reordered"],
)
def test_frames_not_from_this_session_in_this_order_are_refused(attack: str) -> None:
    a, b = wire(call(1)), wire(call(2))
    tag = Tagger(WRONG_KEY if attack == "other-key" else KEY)
    first, second = tag(a), tag(b)
    data = {
        "untagged": a + b + b"\x00" * TAG_BYTES,
        "other-key": first,
        "replayed": first + first,
        "reordered": second + first,
    }[attack]
    assert "failed authentication" in refused(opened(tagged=True), data, AuthenticationError)


def test_truncated_input_is_no_frame_and_is_seen_mid_frame() -> None:
    data = wire(call(1), [b"p" * 1000])
    for cut in (1, 11, 12, 40, len(data) - 1):
        sink = opened()
        assert sink.feed(data[:cut]) == []
        assert sink.reader.mid_frame, cut
    sink = opened()
    assert not sink.reader.mid_frame
    assert replies(sink.feed(data)) == [1]
    assert not sink.reader.mid_frame


def test_repr_shows_the_mode_and_what_is_unread() -> None:
    reader = Sink().reader
    assert repr(reader) == "<FrameReader handshake unread=0 mid_frame=False>"
    reader.open()
    reader.feed(wire(call(1))[:5])
    assert repr(reader) == "<FrameReader open unread=5 mid_frame=True>"


# ---------------------------------------------------------------- the handshake


class Side(Sink):
    """One end of a handshake: a frame reader and the state machine, fed bytes."""

    def __init__(self, key: bytes, dialer: bool) -> None:
        super().__init__()
        self.hs = HandshakeMachine(
            key, dialer=dialer, addr="unix:@dialer" if dialer else "", peer_name=lambda: "peer-x"
        )
        self.out = b""

    def on_handshake(self, header: bytes) -> None:
        self.out += joined(self.hs.receive(header))
        if self.hs.done:
            self.reader.open()

    def receive(self, data: bytes) -> bytes:
        """Feed ``data``; return what this side sends back."""
        self.reader.feed(data)
        out, self.out = self.out, b""
        return out


def run_handshake(dialer: Side, acceptor: Side) -> None:
    challenge = acceptor.receive(joined(dialer.hs.start()))
    auth = dialer.receive(challenge)
    assert acceptor.receive(auth) == b""


def test_the_right_key_authenticates_both_sides_and_agrees_on_frame_keys() -> None:
    dialer, acceptor = Side(KEY, True), Side(KEY, False)
    assert acceptor.hs.start() == []

    run_handshake(dialer, acceptor)

    assert dialer.hs.done and acceptor.hs.done
    assert acceptor.hs.peer_addr == "unix:@dialer"
    d_out, d_in = dialer.hs.frame_keys()
    a_out, a_in = acceptor.hs.frame_keys()
    assert (d_out, d_in) == (a_in, a_out) and d_out != d_in
    assert repr(dialer.hs) == "<HandshakeMachine dialer done>"


def test_frame_keys_are_fresh_per_session() -> None:
    keys = set()
    for _ in range(2):
        dialer, acceptor = Side(KEY, True), Side(KEY, False)
        run_handshake(dialer, acceptor)
        keys.add(dialer.hs.frame_keys())
    assert len(keys) == 2


def test_messages_in_the_same_bytes_as_auth_follow_the_handshake() -> None:
    dialer, acceptor = Side(KEY, True), Side(KEY, False)
    auth = dialer.receive(acceptor.receive(joined(dialer.hs.start())))

    assert acceptor.receive(auth + wire(call(7))) == b""

    assert acceptor.hs.done
    assert replies(acceptor.take()) == [7]


def test_a_dialer_with_the_wrong_key_is_refused_by_the_acceptor() -> None:
    dialer, acceptor = Side(WRONG_KEY, True), Side(KEY, False)
    challenge = acceptor.receive(joined(dialer.hs.start()))
    assert repr(acceptor.hs) == "<HandshakeMachine acceptor challenged>"

    # The dialer finds out first: the acceptor's proof does not verify under its key.
    with pytest.raises(AuthenticationError, match=r"peer peer-x failed to prove the job key$"):
        dialer.receive(challenge)
    # A dialer that sends its proof anyway is refused.
    nonce = _decode_handshake(challenge[PREFIX.size :]).nonce  # type: ignore[union-attr]
    auth = wire(Auth(_auth.proof(WRONG_KEY, b"dialer", nonce, dialer.hs.nonce)))
    with pytest.raises(AuthenticationError, match=r"failed to prove the job key \(wrong key\?\)"):
        acceptor.receive(auth)
    assert not acceptor.hs.done


@pytest.mark.parametrize(
    "make_mac",
    [
        lambda ch, mine: ch.mac,  # reflect the acceptor's own proof back
        lambda ch, mine: _auth.proof(KEY, b"acceptor", ch.nonce, mine),  # wrong side label
        lambda ch, mine: _auth.proof(KEY, b"dialer", mine, ch.nonce),  # nonces swapped
        lambda ch, mine: _auth.proof(KEY, b"dialer", ch.nonce, os.urandom(16)),  # another nonce
        lambda ch, mine: b"",
    ],
    ids=["reflected", "wrong-side", "swapped-nonces", "other-nonce", "empty"],
)
def test_an_invalid_proof_with_the_right_key_is_refused(make_mac: Any) -> None:
    acceptor = Side(KEY, False)
    nonce = os.urandom(16)
    challenge = _decode_handshake(acceptor.receive(wire(Hello(nonce, "unix:@d")))[PREFIX.size :])
    assert isinstance(challenge, Challenge)

    with pytest.raises(AuthenticationError, match="failed to prove the job key"):
        acceptor.receive(wire(Auth(make_mac(challenge, nonce))))


@pytest.mark.parametrize(
    ("dialer", "data", "error"),
    [
        (False, raw_frame(b"\xc1"), "sent an undecodable handshake"),
        (False, wire(call(7)), "sent an undecodable handshake"),  # a message, not a handshake
        (False, wire(Auth(b"m" * 32)), "sent Auth out of turn"),
        (False, wire(Challenge(b"n" * 16, b"m" * 32)), "sent Challenge out of turn"),
        (False, wire(Hello(b"n" * 15, "unix:@d")), "sent a 15-byte nonce (expected 16)"),
        (True, wire(Hello(b"n" * 16, "unix:@d")), "sent Hello out of turn"),
        (True, wire(Challenge(b"n" * 3, b"m" * 32)), "failed to prove the job key"),
    ],
    ids=[
        "not-msgpack",
        "message",
        "auth-first",
        "challenge-to-acceptor",
        "short-nonce",
        "hello-to-dialer",
        "short-challenge",
    ],
)
def test_garbage_in_the_handshake_is_refused(dialer: bool, data: bytes, error: str) -> None:
    side = Side(KEY, dialer)
    side.hs.start()

    with pytest.raises(AuthenticationError, match=f"^peer peer-x {re.escape(error)}"):
        side.receive(data)
    assert not side.hs.done


def test_a_second_hello_is_refused() -> None:
    acceptor = Side(KEY, False)
    acceptor.receive(wire(Hello(os.urandom(16), "unix:@d")))

    with pytest.raises(AuthenticationError, match="sent Hello out of turn"):
        acceptor.receive(wire(Hello(os.urandom(16), "unix:@d")))


def test_a_handshake_that_stalls_mid_frame_completes_when_the_rest_arrives() -> None:
    dialer, acceptor = Side(KEY, True), Side(KEY, False)
    hello = joined(dialer.hs.start())

    assert acceptor.receive(hello[:-1]) == b""  # one byte short: nothing to answer yet
    assert acceptor.hs.state is HandshakeState.WAITING and acceptor.reader.mid_frame
    challenge = acceptor.receive(hello[-1:])
    auth = b""
    for i in range(len(challenge)):  # the challenge trickles in byte by byte
        auth += dialer.receive(challenge[i : i + 1])
        assert bool(auth) == (i == len(challenge) - 1)
    assert acceptor.receive(auth[:7]) == b""
    assert not acceptor.hs.done
    assert acceptor.receive(auth[7:]) == b""

    assert dialer.hs.done and acceptor.hs.done


def test_no_message_is_decoded_before_the_handshake() -> None:
    """Until opened, a reader hands out raw headers only: nothing of a stranger's frame
    is decoded as a message (let alone unpickled)."""
    sink = Sink()

    assert sink.feed(wire(call(7))) == []

    [header] = sink.headers
    assert msgspec.msgpack.Decoder(Message).decode(header) == call(7)  # (untouched bytes)
    assert not sink.reader.opened


def test_the_dialer_waits_for_a_busy_peer_as_long_as_for_any_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "handshake_timeout", 2.0)
    monkeypatch.setattr(config, "heartbeat_timeout", 5.0)

    assert HandshakeMachine(KEY, dialer=True).deadline == 5.0
    assert HandshakeMachine(KEY, dialer=False).deadline == 2.0


def test_a_peer_whose_bytes_wait_unread_gets_another_look_until_the_liveness_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "handshake_timeout", 2.0)
    monkeypatch.setattr(config, "heartbeat_timeout", 5.0)
    hs = HandshakeMachine(KEY, dialer=False)

    assert hs.look_again_in(2.0, unread=False) is None  # silent: give up
    assert hs.look_again_in(2.0, unread=True) == 0.1  # it sent; our loop was busy
    assert hs.look_again_in(6.9, unread=True) == 0.1
    assert hs.look_again_in(7.0, unread=True) is None  # past deadline + heartbeat_timeout
