"""The handshake state machine (danaus.actors._handshake) driving a frame reader, both
sides fed bytes directly: no socket, no loop. The right key and a wrong one, invalid
proofs, garbage and stalls mid-frame, and how long a side waits. The reader alone:
test_frames.py; what both share: frames_kit.py.
"""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec
import pytest

from danaus import _auth
from danaus.actors._handshake import HandshakeMachine, HandshakeState
from danaus.actors._wire import PREFIX, Auth, Challenge, Hello, Message
from danaus.config import config
from danaus.errors import AuthenticationError

from .frames_kit import (
    KEY,
    WRONG_KEY,
    Sink,
    _decode_handshake,
    call,
    joined,
    raw_frame,
    replies,
    wire,
)

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
