"""The frame reader (danaus.actors._frame_reader) fed bytes directly: no socket, no loop. Whole
frames however the bytes are cut, tagged or not, and the input it refuses (limits,
undecodable headers, wrong tags). The handshake state machine: test_handshake.py; what
both share: frames_kit.py.

Frames are built by hand (``frame`` from _wire, tags from ``frame_tag``), so these tests
check the wire layout and its limits, not danaus talking to danaus.
"""

from __future__ import annotations

import os

import pytest

from danaus.actors._frame_tags import TAG_BYTES
from danaus.actors._wire import MAGIC, MAX_HANDSHAKE_HEADER, MAX_PARTS, PART_LEN, PREFIX, Hello
from danaus.config import config
from danaus.errors import AuthenticationError, ProtocolError

from .frames_kit import (
    KEY,
    WRONG_KEY,
    Sink,
    Tagger,
    _encode,
    call,
    expected,
    opened,
    raw_frame,
    replies,
    stream,
    wire,
)

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
