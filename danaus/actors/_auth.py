"""HMAC challenge-response over the job's shared secret.

Both sides prove they hold the key; neither sends it. Each proof binds both nonces and
says which side made it, so a proof cannot be replayed or reflected.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ..config import config
from ._process import process

__all__ = ["frame_keys", "job_key", "new_nonce", "proof", "verify"]


def job_key() -> bytes:
    """The secret of this job: ``config.auth_key`` (hex) when set, else a fresh random one."""
    key = process.job_key
    if key is None:
        key = bytes.fromhex(config.auth_key) if config.auth_key else secrets.token_bytes(32)
        process.job_key = key
    return key


def set_job_key(key: bytes) -> None:
    """Adopt the key handed down by the controller (procs call this at start)."""
    process.job_key = key


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


NONCE_BYTES = 16


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
