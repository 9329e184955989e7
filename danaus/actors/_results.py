"""What comes back to a runtime's ports: the shapes of port owners, and replies decoded.

A port is owned by a :class:`PortHandler` (every value it gets, until it says it is
finished), by a :class:`~danaus.actors._future.Future` (one reply settles it), or, for a
cast tree node in this proc, by a :class:`GatherNode`. This module owns those shapes,
the settling of a future port, the turning of a :class:`~danaus.actors._wire.Result`
off the wire into a value or an exception (:func:`on_result`, the runtime's handler of
``Result``), and :class:`SkipOnLoss`, the ranks of a cast subtree whose sequence numbers
are skipped if their connection is lost. The runtime owns the port table itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, cast

import msgspec

from ..errors import SerializationError
from ._errinfo import error_decode, error_from_info
from ._future import Future
from ._serialize import loads
from ._wire import ERROR, OK, Buffer, Gathered, Result, SeqSkip

if TYPE_CHECKING:
    from ._connection import Connection
    from ._runtime import Runtime

__all__ = ["GatherNode", "PortHandler", "PortOwner", "SkipOnLoss", "on_result", "settle"]


class PortHandler(Protocol):
    """Receives what arrives on a port; returns True when the port is finished."""

    def __call__(self, rank: int, status: int, value: object) -> bool: ...


#: What a port delivers to: a handler of every value, or a future for one reply (its
#: value comes off the wire untyped, so the port table holds it as ``Future[object]``).
PortOwner: TypeAlias = "PortHandler | Future[object]"


class GatherNode(Protocol):
    """A cast tree node in this proc, waiting on a port for the results of a subtree."""

    def add_gathered(self, msg: Gathered, parts: list[bytes | bytearray | memoryview]) -> None: ...


class SkipOnLoss(list[int]):
    """The ranks of a cast subtree waiting on one connection. If it is lost, the actors
    of that subtree that are still alive are told not to wait for the lost message's
    sequence number (else they would hold every later message from that sender)."""

    def __init__(self, actor: str, sender: str, targets: Sequence[tuple[int, str, int]]) -> None:
        super().__init__(r for r, _, _ in targets)
        self.actor = actor
        self.sender = sender
        self.targets = list(targets)

    def send_skips(self, rt: Runtime) -> None:
        for _, addr, seq in self.targets:
            if seq:
                rt.connection(addr).send(SeqSkip(self.actor, seq, self.sender))


def _A_REPLY() -> str:
    return "a reply"


def settle(fut: Future[object], status: int, value: object) -> None:
    """Resolve a future port with what arrived: an exception (``ERROR``) or a value."""
    if not fut.done():
        if status == ERROR:
            fut.set_exception(cast(BaseException, value))  # (an ERROR's value is one)
        else:
            fut.set_result(value)


def on_result(rt: Runtime, conn: Connection, msg: Result, parts: Sequence[Buffer]) -> None:
    """A reply: decoded (a value, or the exception it carries), to its port in ``rt``."""
    port = msg.port
    conn.pending.pop(port, None)
    handler = rt.ports.get(port)
    if handler is None:
        return  # a reply nobody waits for any more (e.g. a timed-out call)
    status = msg.status
    value: object
    try:
        if status == OK:
            value = loads(msg.value, msg.pickled, parts, _A_REPLY)
        elif status == ERROR:
            value = error_from_info(error_decode(msg.value))
        else:
            value = None
    except (SerializationError, msgspec.DecodeError) as e:
        status, value = ERROR, SerializationError(str(e))
    if isinstance(handler, Future):
        del rt.ports[port]
        settle(handler, status, value)
    elif handler(msg.rank, status, value):
        rt.ports.pop(port, None)
