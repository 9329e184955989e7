"""HMAC challenge-response over a shared secret: what every handshake of danaus proves
(the actor layer's connections, the admin endpoint, the TCP data plane).

Both sides prove they hold the key; neither sends it. Each proof binds both nonces and
says which side made it, so a proof cannot be replayed or reflected. The key itself is
the job's, which the actor layer keeps (``ActorProcess.job_key``).
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["NONCE_BYTES", "frame_keys", "new_nonce", "proof", "verify"]

NONCE_BYTES = 16


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def proof(key: bytes, side: bytes, mine: bytes, theirs: bytes) -> bytes:
    """HMAC over the side label and both nonces, each length-prefixed (unambiguous)."""
    msg = b"".join(len(f).to_bytes(2, "big") + f for f in (side, mine, theirs))
    return hmac.new(key, msg, hashlib.sha256).digest()


def verify(key: bytes, side: bytes, mine: bytes, theirs: bytes, mac: bytes) -> bool:
    return hmac.compare_digest(proof(key, side, mine, theirs), mac)


def frame_keys(key: bytes, dialer_nonce: bytes, acceptor_nonce: bytes) -> tuple[bytes, bytes]:
    """Session keys that bind every later frame of a connection to its handshake:
    ``(dialer -> acceptor, acceptor -> dialer)``. Both nonces are fresh per connection,
    so frames of one session verify in no other (and a relay cannot splice its own in)."""
    return (
        proof(key, b"frames dialer->acceptor", dialer_nonce, acceptor_nonce),
        proof(key, b"frames acceptor->dialer", dialer_nonce, acceptor_nonce),
    )
