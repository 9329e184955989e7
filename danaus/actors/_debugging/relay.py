"""Where the debugger's messages arriving at this process go: in the controller, to the
registry of sessions (:mod:`danaus.actors._debugging.sessions`); in a proc (an actor there spawned a
mesh of its own, whose actor is paused), up to the proc's own parent, and so on up to the
controller, with input and detach relayed back down.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from typing import TYPE_CHECKING

import msgspec

from .._connection import Connection
from .._process import process
from .._wire import DebugClose, DebugDetach, DebugInput, DebugOpen, DebugOutput
from .hook import proc_parent
from .sessions import registry, unexcuse

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = [
    "on_debug_close",
    "on_debug_down",
    "on_debug_open",
    "on_debug_output",
    "sweep",
]


# ---------------------------------------------------------------- relaying (in a proc)


@dataclasses.dataclass
class _Hop:
    """One relayed session: its channel below, and its number on the parent's connection."""

    down: Connection
    wire: int
    up: Connection
    up_id: int
    proc: str  # the paused proc's address


class _Relay:
    """In a proc: sessions of actors of meshes this proc spawned, passed on to its own
    parent (and so on up to the controller). Only this proc's loop touches it."""

    def __init__(self) -> None:
        self.by_down: dict[tuple[Connection, int], _Hop] = {}
        self.by_up: dict[int, _Hop] = {}

    def __repr__(self) -> str:
        return f"<_Relay sessions={len(self.by_down)}>"

    def opened(self, rt: Runtime, conn: Connection, msg: DebugOpen) -> bool:
        parent = proc_parent()
        if not parent:
            return False  # (not started by anyone: keep the session here)
        hop = _Hop(conn, msg.session, rt.connection(parent), secrets.randbits(62), msg.proc)
        self.by_down[(conn, msg.session)] = hop
        self.by_up[hop.up_id] = hop
        hop.up.send(msgspec.structs.replace(msg, session=hop.up_id))
        return True

    def output(self, conn: Connection, msg: DebugOutput) -> bool:
        hop = self.by_down.get((conn, msg.session))
        if hop is None:
            return False
        hop.up.send(msgspec.structs.replace(msg, session=hop.up_id))
        return True

    def closed(self, conn: Connection, wire: int) -> bool:
        hop = self.by_down.pop((conn, wire), None)
        if hop is None:
            return False
        self.by_up.pop(hop.up_id, None)
        hop.up.send(DebugClose(hop.up_id))
        return True

    def downward(self, up_id: int, msg: DebugInput | DebugDetach) -> None:
        hop = self.by_up.get(up_id)
        if hop is not None:
            hop.down.send(msgspec.structs.replace(msg, session=hop.wire))

    def lost(self, rt: Runtime, peer: str) -> None:
        for hop in list(self.by_down.values()):
            if hop.down.peer == peer:  # the paused proc's channel broke: its session too
                self.closed(hop.down, hop.wire)
                unexcuse(rt, hop.proc)
            elif hop.up.peer == peer:  # our parent is gone: nobody will attach
                del self.by_down[(hop.down, hop.wire)]
                self.by_up.pop(hop.up_id, None)
                hop.down.send(DebugDetach(hop.wire))


_relay = _Relay()


# ---------------------------------------------------------------- message handlers


def _watch(rt: Runtime) -> None:
    if rt not in process.debug_watching:
        process.debug_watching[rt] = callback = functools.partial(_on_lost, rt)
        rt.watch_lost(callback)


def _on_lost(rt: Runtime, peer: str) -> None:
    registry.lost(rt, peer)
    _relay.lost(rt, peer)


def on_debug_open(rt: Runtime, conn: Connection, msg: DebugOpen, parts: list[bytearray]) -> None:
    _watch(rt)
    if process.in_proc and _relay.opened(rt, conn, msg):
        return
    registry.opened(conn, msg)


def on_debug_output(
    rt: Runtime, conn: Connection, msg: DebugOutput, parts: list[bytearray]
) -> None:
    if not _relay.output(conn, msg):
        registry.output(conn, msg)


def on_debug_close(rt: Runtime, conn: Connection, msg: DebugClose, parts: list[bytearray]) -> None:
    if not _relay.closed(conn, msg.session):
        registry.closed(conn, msg.session)


def on_debug_down(
    rt: Runtime, conn: Connection, msg: DebugInput | DebugDetach, parts: list[bytearray]
) -> None:
    """Input or detach from the parent, for a session relayed through this proc."""
    _relay.downward(msg.session, msg)


def sweep(rt: Runtime) -> None:
    """On every heartbeat: holders that went away let their sessions continue."""
    registry.sweep()
