"""Session tags of control-plane frames on TCP without TLS.

After the handshake, every frame in each direction carries a tag under that direction's
session key, over the frame's sequence number and bytes: keyed BLAKE2b for small frames,
HMAC-SHA256 for large ones. This module owns the tag makers and the tag computation; the
reader (:mod:`~danaus.actors._frame_reader`) checks tags, the connection's writer and the
debugger channel add them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import TypeAlias

from ._wire import Buffer

__all__ = ["LARGE_FRAME", "TAG_BYTES", "FrameMacs", "frame_macs", "frame_tag"]

#: Length of the tag after each frame on TCP without TLS, and the frame size from which
#: it is an HMAC-SHA256 (below: keyed BLAKE2b).
TAG_BYTES = 32
LARGE_FRAME = 256 << 10

#: (keyed BLAKE2b, HMAC-SHA256) holding one direction's session key, copied per frame.
FrameMacs: TypeAlias = "tuple[hashlib.blake2b, hmac.HMAC]"


def frame_macs(key: bytes) -> FrameMacs:
    """The tag makers of one direction of a session. Keyed BLAKE2b for small frames (1 µs
    each), HMAC-SHA256 for large ones (faster per byte here); both sides pick by the
    frame's length."""
    return (
        hashlib.blake2b(key=key, digest_size=TAG_BYTES),
        hmac.new(key, digestmod=hashlib.sha256),
    )


def frame_tag(macs: FrameMacs, seq: int, size: int, pieces: Sequence[Buffer]) -> bytes:
    """The tag of the frame made of ``pieces`` (``size`` bytes), number ``seq`` in its
    direction: keyed BLAKE2b for small frames, HMAC-SHA256 for large ones (both sides pick
    by the frame's length); ``macs`` hold the keys, copied per frame."""
    h = macs[size >= LARGE_FRAME].copy()
    h.update(seq.to_bytes(8, "little"))
    for p in pieces:
        h.update(p)
    digest: bytes = h.digest()
    return digest
