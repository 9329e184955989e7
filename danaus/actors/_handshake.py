"""The authentication handshake of one connection, as a state machine with no socket.

The dialer says :class:`~danaus.actors._wire.Hello` (its nonce and listening address);
the acceptor proves it holds the job key and sends its own nonce
(:class:`~danaus.actors._wire.Challenge`); the dialer proves it holds the key
(:class:`~danaus.actors._wire.Auth`). Each side feeds :meth:`HandshakeMachine.receive` the
header of every handshake frame it receives, and writes the frames it gets back; a
peer that does anything else raises :class:`~danaus.errors.AuthenticationError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from .. import _auth
from ..config import config
from ..errors import AuthenticationError
from ._wire import Auth, Buffer, Challenge, Handshake, Hello, frame

__all__ = ["HandshakeMachine", "HandshakeState"]

_hs_encode = msgspec.msgpack.Encoder().encode
_hs_decode = msgspec.msgpack.Decoder(Handshake).decode


class HandshakeState(enum.Enum):
    WAITING = "waiting"  # for the peer's first handshake message
    CHALLENGED = "challenged"  # acceptor: sent its Challenge, waits for Auth
    DONE = "done"


class HandshakeMachine:
    """One side of the HMAC challenge-response over the job ``key``.

    ``dialer`` says which side; ``addr`` is this side's listening address (the dialer
    announces it). Once :attr:`done`, :attr:`peer_addr` is the dialer's address (on the
    acceptor) and :meth:`frame_keys` the session keys that tag later frames.
    """

    def __init__(
        self,
        key: bytes,
        *,
        dialer: bool,
        addr: str = "",
        peer_name: Callable[[], str] = lambda: "(unknown peer)",
    ) -> None:
        self.dialer = dialer
        self.state = HandshakeState.WAITING
        #: the address the dialing peer announced (acceptor side)
        self.peer_addr: str | None = None
        self._key = key
        self._addr = addr
        self._peer_name = peer_name
        self.nonce = _auth.new_nonce()
        self._peer_nonce = b""

    def __repr__(self) -> str:
        side = "dialer" if self.dialer else "acceptor"
        return f"<HandshakeMachine {side} {self.state.value}>"

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.DONE

    @property
    def deadline(self) -> float:
        """Seconds the peer has to complete the handshake. The dialer chose its peer, which
        may merely be busy: it waits as long as for any peer's answer
        (``heartbeat_timeout``); the acceptor bounds strangers more tightly."""
        if self.dialer:
            return max(config.handshake_timeout, config.heartbeat_timeout)
        return config.handshake_timeout

    def look_again_in(self, waited: float, *, unread: bool) -> float | None:
        """At the deadline, ``waited`` seconds in: when to look again, or None to give up.

        Bytes from the peer still ``unread`` mean that it did send, and that our own loop
        was too busy to read them (timers run before the poll). A busy proc is slow, not
        hostile: look again shortly, bounded by the liveness timeout.
        """
        if unread and waited < self.deadline + config.heartbeat_timeout:
            return min(0.1, self.deadline)
        return None

    def start(self) -> list[Buffer]:
        """The frames to send first: the dialer's Hello (the acceptor waits)."""
        if not self.dialer:
            return []
        return frame(_hs_encode(Hello(self.nonce, self._addr)))

    def receive(self, header: bytes) -> list[Buffer]:
        """Take the header of one handshake frame from the peer; returns the frames to
        send back (maybe none). Raises ``AuthenticationError`` if the peer did not
        prove the key, sent garbage, or spoke out of turn."""
        try:
            msg = _hs_decode(header)
        except msgspec.DecodeError as e:
            raise AuthenticationError(
                f"peer {self._peer_name()} sent an undecodable handshake: {e}"
            ) from e
        key, state = self._key, self.state
        if not self.dialer and isinstance(msg, Hello) and state is HandshakeState.WAITING:
            if len(msg.nonce) != _auth.NONCE_BYTES:
                raise AuthenticationError(
                    f"peer {self._peer_name()} sent a {len(msg.nonce)}-byte nonce "
                    f"(expected {_auth.NONCE_BYTES})"
                )
            self._peer_nonce = msg.nonce
            self.peer_addr = msg.addr
            self.state = HandshakeState.CHALLENGED
            mac = _auth.proof(key, b"acceptor", msg.nonce, self.nonce)
            return frame(_hs_encode(Challenge(self.nonce, mac)))
        if self.dialer and isinstance(msg, Challenge) and state is HandshakeState.WAITING:
            if len(msg.nonce) != _auth.NONCE_BYTES or not _auth.verify(
                key, b"acceptor", self.nonce, msg.nonce, msg.mac
            ):
                raise AuthenticationError(f"peer {self._peer_name()} failed to prove the job key")
            self._peer_nonce = msg.nonce
            self.state = HandshakeState.DONE
            return frame(_hs_encode(Auth(_auth.proof(key, b"dialer", msg.nonce, self.nonce))))
        if not self.dialer and isinstance(msg, Auth) and state is HandshakeState.CHALLENGED:
            if not _auth.verify(key, b"dialer", self.nonce, self._peer_nonce, msg.mac):
                raise AuthenticationError(
                    f"peer {self._peer_name()} failed to prove the job key (wrong key?)"
                )
            self.state = HandshakeState.DONE
            return []
        raise AuthenticationError(
            f"peer {self._peer_name()} sent {type(msg).__name__} out of turn in the handshake"
        )

    def frame_keys(self) -> tuple[bytes, bytes]:
        """``(outgoing, incoming)`` session keys of this side, once done."""
        assert self.done
        d2a, a2d = _auth.frame_keys(
            self._key,
            *((self.nonce, self._peer_nonce) if self.dialer else (self._peer_nonce, self.nonce)),
        )
        return (d2a, a2d) if self.dialer else (a2d, d2a)
