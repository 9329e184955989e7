"""``Channel.open()`` -> ``(Port, PortReceiver)``: values sent to a port from anywhere."""

from __future__ import annotations

import collections
import logging
import traceback
import weakref
from typing import Generic, NoReturn, TypeVar, cast

import msgspec

from ..errors import ClosedError
from ._context import ActorContext, current, current_rank
from ._errinfo import encode_error, info_from_error
from ._future import Future
from ._loops import current_runtime, run_on
from ._runtime import Runtime
from ._serialize import dumps
from ._wire import CLOSE, ERROR, NIL, OK, Buffer, Result

__all__ = ["Channel", "Port", "PortReceiver", "RankedPortReceiver"]

log = logging.getLogger("danaus.port")

T = TypeVar("T")


class Port(Generic[T]):
    """Where values go: a small picklable reference to a receiver in some process.

    Pass it to an actor as an argument; the actor calls ``port.send(v)`` as often as it
    likes, and the values arrive at the receiver in the order sent.
    """

    __slots__ = ("addr", "port_id")

    def __init__(self, addr: str, port_id: int) -> None:
        self.addr = addr
        self.port_id = port_id

    def __repr__(self) -> str:
        return f"Port({self.addr}#{self.port_id})"

    def __reduce__(self) -> tuple[type[Port[T]], tuple[str, int]]:
        return (Port, (self.addr, self.port_id))

    def send(self, value: T) -> None:
        """Send ``value`` (fire and forget; it is pickled now, in the caller)."""
        raw, pickled, parts = dumps(value, lambda: f"value sent to {self!r}")
        self._post(OK, raw, pickled, parts, value)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's next ``recv()`` raise ``exc`` (as an ``ActorError`` if remote)."""
        tb = "".join(traceback.format_exception(exc))
        info = info_from_error(exc, "", str(current_rank()), tb)
        self._post(ERROR, encode_error(info), False, [], exc)

    def close(self) -> None:
        """Tell the receiver that nothing more will come (its ``recv()`` raises ClosedError)."""
        self._post(CLOSE, None, False, [], None)

    def _post(
        self,
        status: int,
        raw: msgspec.Raw | None,
        pickled: bool,
        parts: list[Buffer],
        local: object,
    ) -> None:
        rt = current_runtime()
        rank = current_rank().rank if current_rank().sizes else -1
        if rt.addr == self.addr:
            run_on(rt, rt.deliver, self.port_id, rank, status, local)
            return

        msg = Result(self.port_id, status, raw if raw is not None else NIL, pickled, rank)
        run_on(rt, _send, rt, self.addr, msg, parts, current.get().actor)


def forward(rt: Runtime, port: Port[T], rank: int, status: int, value: object) -> None:
    """Give ``port`` a value (or, with status ``ERROR``, an exception) that arrived here,
    saying it comes from ``rank`` (what a ranked receiver reports). On ``rt``'s loop."""
    if port.addr == rt.addr:
        rt.deliver(port.port_id, rank, status, value)
        return
    parts: list[Buffer] = []
    pickled = False
    if status == ERROR:
        raw = encode_error(info_from_error(cast(BaseException, value)))  # ERROR: an exception
    else:
        try:
            raw, pickled, parts = dumps(value, lambda: f"value forwarded to {port!r}")
        except Exception as e:  # the receiver hears why instead of waiting for nothing
            raw, pickled, parts = encode_error(info_from_error(e)), False, []
            status = ERROR
    _send(rt, port.addr, Result(port.port_id, status, raw, pickled, rank), list(parts), None)


def _close_port(rt: Runtime, port_id: int) -> None:
    """A dropped receiver's port goes away (from any thread; also once the loop closed)."""
    if rt.loop.is_closed():
        rt.ports.pop(port_id, None)
        return
    try:
        run_on(rt, rt.close_port, port_id)
    except RuntimeError:  # the loop closed meanwhile
        rt.ports.pop(port_id, None)


def _send(
    rt: Runtime, addr: str, msg: Result, parts: list[Buffer], sender: ActorContext | None
) -> None:
    conn = rt.connection(addr)

    def undelivered(reason: BaseException | None) -> None:
        # Never silently: the sending actor hears of it (as in Monarch, an undeliverable
        # message fails the sender unless its _handle_undeliverable_message takes it).
        why = (
            f"a message to port {addr}#{msg.port} could not be delivered: "
            f"{rt.peer_lost_error(addr, reason)}"
        )
        inst = sender.runtime_actor if sender is not None else None
        if inst is not None and not inst.stopped:
            inst.undeliverable(why)
        else:
            log.error("%s", why)

    if not conn.send_reported(msg, parts, undelivered):
        undelivered(conn.close_reason)


class PortReceiver(Generic[T]):
    """The receiving end of a :class:`Port`: ``await receiver.recv()``."""

    def __init__(self, rt: Runtime, once: bool) -> None:
        self._rt = rt
        self._once = once
        #: (rank, status, value): a value sent (the sender's T), or an exception
        self._values: collections.deque[tuple[int, int, object]] = collections.deque()
        #: (future, ranked): a T, or a (rank, T) when ranked
        self._waiters: collections.deque[tuple[Future[object], bool]] = collections.deque()
        self._closed = False
        ref = weakref.ref(self)

        def handler(rank: int, status: int, value: object) -> bool:
            me = ref()  # a dropped receiver closes its port at the next message
            return True if me is None else me._on_message(rank, status, value)  # noqa: SLF001 - a PortReceiver's own

        self.port_id = rt.open_port(handler)
        weakref.finalize(self, _close_port, rt, self.port_id)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<PortReceiver #{self.port_id} {state} buffered={len(self._values)}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a PortReceiver cannot be pickled: it receives in this process, as in "
            "Monarch; pass its Port (the sending end), a reference to this receiver"
        )

    def _on_message(self, rank: int, status: int, value: object) -> bool:
        if status == CLOSE:
            self._closed = True
        else:
            self._values.append((rank, status, value))
        self._wake()
        return self._closed or self._once

    def _wake(self) -> None:
        while self._waiters and (self._values or self._closed):
            w, ranked = self._waiters.popleft()
            if w.done():
                continue
            if self._values:
                rank, status, value = self._values.popleft()
                if status == ERROR:
                    w.set_exception(cast(BaseException, value))  # ERROR: an exception
                elif not ranked:
                    w.set_result(value)
                elif rank < 0:
                    w.set_exception(
                        ValueError(
                            f"a ranked receiver (port #{self.port_id}) got a value without a "
                            f"rank (sent from outside any actor): {value!r}"
                        )
                    )
                else:
                    w.set_result((rank, value))
            else:
                w.set_exception(ClosedError(f"port #{self.port_id} was closed by its sender"))

    def recv(self) -> Future[T]:
        """The next value, in the order sent: ``await r.recv()`` or ``r.recv().get()``."""
        return cast("Future[T]", self._recv(False))

    def recv_ranked(self) -> Future[tuple[int, T]]:
        """The next ``(rank, value)``, in the order sent (``ranked().recv()``)."""
        return cast("Future[tuple[int, T]]", self._recv(True))

    def _recv(self, ranked: bool) -> Future[object]:
        fut: Future[object] = Future(loop=self._rt.loop)

        def arm() -> None:
            self._waiters.append((fut, ranked))
            self._wake()

        run_on(self._rt, arm)
        return fut

    def ranked(self) -> RankedPortReceiver[T]:
        """This receiver, giving ``(rank, value)`` pairs: ``rank`` is where the sending
        actor was in the mesh its message was sent to (as Monarch's ``ranked()``)."""
        return RankedPortReceiver(self)

    def close(self) -> None:
        """Stop receiving: the port is unregistered; later sends to it are dropped."""
        self._closed = True
        run_on(self._rt, self._rt.close_port, self.port_id)
        run_on(self._rt, self._wake)


class RankedPortReceiver(Generic[T]):
    """A :class:`PortReceiver` whose ``recv()`` gives ``(rank, value)``; a value sent from
    outside any actor (no rank) raises ``ValueError``."""

    def __init__(self, receiver: PortReceiver[T]) -> None:
        self._receiver = receiver
        self.port_id = receiver.port_id

    def __repr__(self) -> str:
        return f"<RankedPortReceiver of {self._receiver!r}>"

    def recv(self) -> Future[tuple[int, T]]:
        """The next ``(rank, value)``, in the order sent."""
        return self._receiver.recv_ranked()

    def close(self) -> None:
        """Stop receiving (see :meth:`PortReceiver.close`)."""
        self._receiver.close()


class Channel(Generic[T]):
    """Factory of port pairs (Monarch's name)."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        """A new ``(Port, PortReceiver)`` pair owned by the current runtime.

        Args:
            once: the port accepts one value, then closes.
        """
        rt = current_runtime()
        receiver: PortReceiver[T] = PortReceiver(rt, once)
        return Port(rt.addr, receiver.port_id), receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[T], RankedPortReceiver[T]]:
        """Like :meth:`open`, with a receiver that gives ``(rank, value)`` pairs (what
        ``send(endpoint, args, kwargs, port=port)`` fills, one per actor)."""
        port, receiver = Channel[T].open(once)
        return port, receiver.ranked()
