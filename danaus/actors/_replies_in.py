"""What comes back to a runtime's ports: the shapes of port owners, and replies decoded.

A port is owned by a :class:`PortHandler` (every value it gets, until it says it is
finished) or by a :class:`~danaus.actors._future.Future` (one reply settles it); a cast
tree node in this proc waits for its subtrees elsewhere (``_cast``). This module owns
those shapes, the settling of a future port, and the turning of a
:class:`~danaus.actors._wire.Result` off the wire into a value or an exception
(:func:`on_result`, the handler of ``Result``). The runtime owns the port table itself;
the replies an actor of this runtime sends are ``_replies_out``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, cast

import msgspec

from ..errors import SerializationError
from ._errinfo import error_decode, error_from_info
from ._future import Future
from ._serialize import loads
from ._wire import ERROR, OK, Buffer, Result

if TYPE_CHECKING:
    from ._connection import Connection
    from ._runtime import Runtime

__all__ = ["PortHandler", "PortOwner", "decode_reply", "on_result", "settle"]


class PortHandler(Protocol):
    """Receives what arrives on a port; returns True when the port is finished."""

    def __call__(self, rank: int, status: int, value: object) -> bool: ...


#: What a port delivers to: a handler of every value, or a future for one reply (its
#: value comes off the wire untyped, so the port table holds it as ``Future[object]``).
PortOwner: TypeAlias = "PortHandler | Future[object]"


def _A_REPLY() -> str:
    return "a reply"


def settle(fut: Future[object], status: int, value: object) -> None:
    """Resolve a future port with what arrived: an exception (``ERROR``) or a value; wake
    the thread waiting in its ``get()``, if any."""
    if not fut.done():
        if status == ERROR:
            fut.set_exception(cast(BaseException, value))  # (an ERROR's value is one)
        else:
            fut.set_result(value)
        waiter = fut.thread_waiter
        if waiter is not None:
            waiter.set()


def decode_reply(
    status: int, raw: msgspec.Raw, pickled: bool, parts: Sequence[Buffer]
) -> tuple[int, object]:
    """One reply off the wire, as its port gets it: ``(OK, value)``, ``(ERROR, the
    exception it carries)``, or ``(status, None)`` for the others; a reply that does not
    decode is an ``ERROR`` with the :class:`~danaus.errors.SerializationError` saying why."""
    try:
        if status == OK:
            return status, loads(raw, pickled, parts, _A_REPLY)
        if status == ERROR:
            return status, error_from_info(error_decode(raw))
        return status, None
    except (SerializationError, msgspec.DecodeError) as e:
        return ERROR, SerializationError(str(e))


def on_result(rt: Runtime, conn: Connection, msg: Result, parts: Sequence[Buffer]) -> None:
    """A reply: decoded (a value, or the exception it carries), to its port in ``rt``."""
    port = msg.port
    conn.pending.pop(port, None)
    handler = rt.ports.get(port)
    if handler is None:
        return  # a reply nobody waits for any more (e.g. a timed-out call)
    status, value = decode_reply(msg.status, msg.value, msg.pickled, parts)
    if isinstance(handler, Future):
        del rt.ports[port]
        settle(handler, status, value)
    elif handler(msg.rank, status, value):
        rt.ports.pop(port, None)
