"""Settings: one object, every field also read from a ``DANAUS_*`` environment variable."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

__all__ = ["Config", "config"]


def _env(name: str, default: Any) -> Any:
    raw = os.environ.get(f"DANAUS_{name.upper()}")
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, list):
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw


@dataclasses.dataclass
class Config:
    """Process-wide settings.

    Each field ``x`` can be set with the environment variable ``DANAUS_X`` (read when
    ``danaus`` is imported) or by assigning ``danaus.config.x = ...`` before use.
    """

    #: Largest frame a peer may send, header and parts together (bytes).
    max_frame_bytes: int = 4 << 30
    #: Largest msgspec header of a frame (bytes).
    max_header_bytes: int = 16 << 20
    #: A peer that has not finished the authentication handshake by then is dropped (s).
    handshake_timeout: float = 5.0
    #: Connections a proc accepts that have not authenticated yet, at most; more are
    #: closed at once (each costs a few KiB until it authenticates).
    max_unauthenticated: int = 256
    #: Arguments and results over this many bytes travel as out-of-band frame parts.
    oob_threshold: int = 64 << 10
    #: Pending outgoing bytes on one connection after which writes are flushed at once.
    flush_bytes: int = 4096
    #: Socket buffer size for control connections (bytes).
    socket_buffer_bytes: int = 4 << 20
    #: How long dialing a peer keeps retrying while it refuses (it may be starting) (s).
    connect_timeout: float = 30.0
    #: How long an actor holds a sender's message while an earlier one is missing (it
    #: went another way, down a cast tree, and may have been lost with a failed proc) (s).
    seq_gap_timeout: float = 10.0
    #: How long a proc holds messages for an actor whose Spawn has not arrived yet (s).
    spawn_wait: float = 30.0
    #: A connection quiet this long gets a ping (s).
    heartbeat_interval: float = 2.0
    #: A peer that says nothing (not even a pong) this long is declared dead: its
    #: connection closes and calls waiting on it fail (s). Must exceed the longest time
    #: a sync endpoint blocks its proc's loop.
    heartbeat_timeout: float = 30.0
    #: How long a spawned proc may take to come up before its spawn fails (s).
    proc_start_timeout: float = 60.0
    #: How long ``stop()`` waits for procs to exit before killing them (s).
    stop_timeout: float = 5.0
    #: Hex-encoded shared secret for authenticating connections across hosts; when
    #: empty, the controller makes a fresh one per job and hands it to its procs.
    auth_key: str = ""
    #: Fan-out of the tree that casts to a mesh go down (0: the sender sends to every
    #: actor itself). Meshes up to this size are always sent to directly.
    cast_fanout: int = 16
    #: Messages an actor may have waiting before it stops reading from their senders.
    mailbox_limit: int = 10_000
    #: A dropped RDMABuffer's memory is kept alive this long, for one-sided writers that
    #: raced the drop (they are told after their write) (s).
    rdma_drop_grace: float = 2.0
    #: Force one data-plane backend ("ibverbs", "shm" or "tcp"); empty: best available.
    rdma_backend: str = ""
    #: Mutual TLS for TCP control connections (across hosts): this proc's certificate and
    #: key, and the CA that signed every peer's certificate (PEM paths). Empty: no TLS.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    #: Deadline of an RDMA transfer (``read_into``, ``write_from``, ``RDMAAction.submit``)
    #: whose call gives no ``timeout=``: past it the transfer fails with ``TimeoutError``
    #: (its owner frozen, overloaded or unreachable) (s).
    rdma_timeout: float = 60.0
    #: Use uvloop for event loops danaus creates, when it is importable.
    use_uvloop: bool = True
    #: How procs start: "fork" (from a per-host fork server that has imported danaus and
    #: the modules in ``preload``, in milliseconds) or "exec" (a fresh interpreter each).
    #: "fork" falls back to "exec", with a log line saying why, where forking is unsafe.
    spawn_method: str = "fork"
    #: Modules the fork server imports before it forks procs (``DANAUS_PRELOAD=a,b``),
    #: besides the heavy ones of a safe list that the spawning process has imported.
    preload: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, _env(f.name, getattr(self, f.name)))


config = Config()
