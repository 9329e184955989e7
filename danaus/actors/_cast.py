"""Casting: one call sent to many actors, down a fan-out tree of procs, and its results
gathered (or reduced) on the way back up. The whole of it lives here, in the actor layer;
the mesh layer asks :meth:`Runtime.call <danaus.actors._runtime.Runtime.call>`
and touches none of this state.

A call on a mesh of N actors costs the sender at most ``fanout`` sends: each proc that
receives a :class:`Cast` (:func:`on_cast`) handles its own actor and forwards the rest
of its subtree, split into at most ``fanout`` parts. Replies come back up the same tree:
each proc sends its parent one :class:`Gathered` (:func:`on_gathered`) with its whole
subtree's results (or, for an ``Accumulator``, one reduced value), never decoding user
values on the way unless it has to reduce them. Per-sender order is kept by sequence
numbers, which the runtime numbers (``Runtime.next_seq``) for direct calls and casts alike;
a subtree whose connection is lost has its numbers skipped (:class:`SkipOnLoss`).

This module owns the tree nodes waiting in this proc for their subtrees (by port, in
``Runtime.gathers``), and is the only one that touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..errors import ProtocolError, SerializationError
from ._errinfo import encode_error, info_from_error
from ._replies_in import decode_reply
from ._serialize import dumps, loads
from ._wire import (
    CAST_NONE,
    CAST_REDUCE,
    ERROR,
    NIL,
    OK,
    Buffer,
    Call,
    Cast,
    Gathered,
    RegionWire,
    Result,
    SeqSkip,
)

if TYPE_CHECKING:
    from ._connection import Connection
    from ._replies_out import ReplySink
    from ._runtime import Runtime

__all__ = ["GatherNode", "SkipOnLoss", "Target", "on_cast", "on_gathered", "send_tree"]

Target = tuple[int, str, int]  # (rank, proc address, sequence number)


def split(targets: Sequence[Target], fanout: int) -> list[list[Target]]:
    """Cut ``targets`` into at most ``fanout`` contiguous, near-equal subtrees."""
    n = len(targets)
    k = min(fanout, n)
    out = []
    start = 0
    for i in range(k):
        size = n // k + (1 if i < n % k else 0)
        out.append(list(targets[start : start + size]))
        start += size
    return out


def send_tree(
    rt: Runtime,
    actor: str,
    method: str,
    targets: list[Target],
    port: int,
    mode: int,
    fanout: int,
    args: msgspec.Raw,
    pickled: bool,
    parts: Sequence[Buffer],
    reducer: tuple[msgspec.Raw, bool] | None = None,
    region: RegionWire | None = None,
    trace: str = "",
) -> None:
    """From the sender: start a cast over ``targets``, numbered already (results to local
    ``port``); ``region``: the slice called, when not the actors' whole mesh; ``trace``:
    the caller's span, with telemetry on. Use ``Runtime.call``, which numbers them."""
    red_raw, red_pickled = reducer or (NIL, False)
    for chunk in split(targets, fanout):
        _send_subtree(
            rt,
            chunk,
            port,
            Cast(
                actor,
                method,
                chunk,
                port,
                "",
                rt.addr,
                mode,
                fanout,
                args,
                pickled,
                red_raw,
                red_pickled,
                region,
                trace,
            ),
            parts,
        )


def _send_subtree(
    rt: Runtime, chunk: list[Target], port: int, msg: Cast, parts: Sequence[Buffer]
) -> None:
    """Send ``msg`` to the head of ``chunk``; its results (or, if the head cannot be reached
    or is lost, an error per rank and a skip of the lost sequence numbers) go to ``port``."""
    head = chunk[0][1]
    conn = rt.connection(head)
    lost = SkipOnLoss(msg.actor, msg.sender, chunk)
    if not conn.send(msg, parts):
        exc = rt.peer_lost_error(head, conn.close_reason)
        for rank, _, _ in chunk:
            rt.deliver(port, rank, ERROR, exc)
        lost.send_skips(rt)
    elif port:
        conn.pending[port] = lost


class SkipOnLoss(list[int]):
    """The ranks of a cast subtree waiting on one connection. If it is lost, the actors
    of that subtree that are still alive are told not to wait for the lost message's
    sequence number (else they would hold every later message from that sender)."""

    def __init__(self, actor: str, sender: str, targets: Sequence[Target]) -> None:
        super().__init__(r for r, _, _ in targets)
        self.actor = actor
        self.sender = sender
        self.targets = list(targets)

    def send_skips(self, rt: Runtime) -> None:
        for _, addr, seq in self.targets:
            if seq:
                rt.connection(addr).send(SeqSkip(self.actor, seq, self.sender))


def _combine_of(reducer: object) -> Callable[[object, object], object]:
    """The combine function of a reduce's ``(identity, combine)``, checked for its shape.

    Raises:
        ProtocolError: the caster sent something else.
    """
    if isinstance(reducer, tuple) and len(reducer) == 2:
        combine: object = reducer[1]
        if callable(combine):
            return combine
    raise ProtocolError(f"a reducer is {type(reducer).__name__}, not (identity, combine)")


class _Reply:
    """A reply sink standing in for a connection: catches the local actor's reply to a
    cast for its tree node."""

    __slots__ = ("node", "sender")

    def __init__(self, node: GatherNode, sender: str) -> None:
        self.node = node
        self.sender = sender

    @property
    def peer(self) -> str:
        return self.sender

    def send(self, msg: Result, parts: Sequence[Buffer] = ()) -> bool:
        self.node.add(msg.rank, msg.status, msg.value, msg.pickled, list(parts))
        return True


class GatherNode:
    """One proc's part of a cast: its own actor's result plus its subtrees'; waits in
    ``Runtime.gathers`` (by port) for each subtree's :class:`Gathered`."""

    def __init__(self, rt: Runtime, conn: Connection, msg: Cast, expected: int) -> None:
        self.rt = rt
        self.conn = conn
        self.msg = msg
        self.left = expected
        self.entries: list[tuple[int, int, msgspec.Raw, bool, int]] = []
        self.parts: list[Buffer] = []
        #: the reduced value so far (the user's), or _NOTHING
        self.acc: object = _NOTHING
        self.error: tuple[int, msgspec.Raw] | None = None
        self._combine: Callable[[object, object], object] | None = None

    def add(
        self, rank: int, status: int, value: msgspec.Raw, pickled: bool, parts: list[Buffer]
    ) -> None:
        """The local actor's result."""
        self._take(rank, status, value, pickled, parts)
        self.subtree_done()

    def add_gathered(self, msg: Gathered, parts: list[Buffer]) -> None:
        """A subtree's results."""
        i = 0
        for rank, status, value, pickled, n in msg.entries:
            self._take(rank, status, value, pickled, parts[i : i + n])
            i += n
        self.subtree_done()

    def _take(
        self, rank: int, status: int, value: msgspec.Raw, pickled: bool, parts: list[Buffer]
    ) -> None:
        if self.msg.mode == CAST_REDUCE:
            self._reduce(rank, status, value, pickled, parts)
        else:
            self.entries.append((rank, status, value, pickled, len(parts)))
            self.parts.extend(parts)

    def add_failure(self, rank: int, exc: BaseException) -> None:
        """One rank of a lost subtree (its connection dropped): record its error."""
        raw = encode_error(info_from_error(exc))
        if self.msg.mode == CAST_REDUCE:
            if self.error is None:
                self.error = (rank, raw)
        else:
            self.entries.append((rank, ERROR, raw, False, 0))

    def subtree_done(self) -> None:
        """One of the parts it waits for (its own actor, or a subtree, answered or lost)
        is in: once all are, send the whole up."""
        self.left -= 1
        if self.left == 0:
            self._finish()

    def _reduce(
        self, rank: int, status: int, value: msgspec.Raw, pickled: bool, parts: list[Buffer]
    ) -> None:
        if self.error is not None:
            return
        if status == ERROR:
            self.error = (rank, value)
            return
        try:
            v = loads(value, pickled, parts, lambda: f"result of {self.msg.method} at rank {rank}")
            if self.acc is _NOTHING:
                self.acc = v
            else:
                if self._combine is None:
                    self._combine = _combine_of(
                        loads(
                            self.msg.reducer,
                            self.msg.reducer_pickled,
                            [],
                            lambda: "the accumulator's combine function",
                        )
                    )
                self.acc = self._combine(self.acc, v)
        except Exception as e:
            self.error = (rank, encode_error(info_from_error(e)))

    def _finish(self) -> None:
        msg = self.msg
        if msg.mode == CAST_REDUCE:
            if self.error is not None:
                rank, raw = self.error
                entries = [(rank, ERROR, raw, False, 0)]
                parts: list[Buffer] = []
            else:
                try:
                    raw, pickled, parts = dumps(self.acc, lambda: f"reduced result of {msg.method}")
                    entries = [(msg.targets[0][0], OK, raw, pickled, len(parts))]
                except SerializationError as e:
                    entries = [
                        (msg.targets[0][0], ERROR, encode_error(info_from_error(e)), False, 0)
                    ]
                    parts = []
        else:
            entries, parts = self.entries, self.parts
        out = Gathered(msg.reply, entries)
        if msg.reply_to:
            self.rt.connection(msg.reply_to).send(out, parts)
        else:
            self.conn.send(out, parts)


_NOTHING = object()


def on_cast(rt: Runtime, conn: Connection, msg: Cast, parts: list[Buffer]) -> None:
    """In a proc: handle our own target of ``msg`` and forward the rest down the tree."""
    if msg.actor not in rt.actors and rt.arrivals.await_actor(
        msg.actor, lambda: on_cast(rt, conn, msg, parts)
    ):
        return  # the cast overtook the actor's Spawn: handle it once the actor exists
    rank, _, seq = msg.targets[0]
    subtrees = split(msg.targets[1:], msg.fanout)
    node: GatherNode | None = None
    if msg.mode != CAST_NONE and msg.reply:
        node = GatherNode(rt, conn, msg, 1 + len(subtrees))
    for chunk in subtrees:
        child_port = 0
        if node is not None:
            loss = _SubtreeLoss(rt, node, len(chunk))
            child_port = loss.port = rt.open_port(loss)
            rt.gathers[child_port] = node
        fwd = Cast(
            msg.actor,
            msg.method,
            chunk,
            child_port,
            rt.addr if child_port else "",
            msg.sender,
            msg.mode if child_port else CAST_NONE,
            msg.fanout,
            msg.args,
            msg.pickled,
            msg.reducer,
            msg.reducer_pickled,
            msg.region,
            msg.trace,
        )
        _send_subtree(rt, chunk, child_port, fwd, parts)
    actor = rt.actors.get(msg.actor)
    reply_to: ReplySink = _Reply(node, msg.sender) if node is not None else conn
    call = Call(
        msg.actor,
        msg.method,
        1 if node is not None else 0,
        msg.args,
        msg.pickled,
        seq,
        msg.region,
        msg.trace,
    )
    if actor is None:
        if node is not None:
            node.add(rank, ERROR, encode_error(rt.arrivals.no_actor(msg.actor)), False, [])
        return
    actor.deliver(reply_to, call, parts, msg.sender)


class _SubtreeLoss:
    """Port handler at a tree node for one subtree: called per rank if its connection drops
    (its results, when they come, arrive as one Gathered, handled by on_gathered)."""

    def __init__(self, rt: Runtime, node: GatherNode, ranks: int) -> None:
        self.rt = rt
        self.node = node
        self.ranks = ranks
        self.port = 0

    def __call__(self, rank: int, status: int, value: object) -> bool:
        # (the error the connection's loss delivers for each rank of the subtree)
        exc = value if isinstance(value, BaseException) else ConnectionError(repr(value))
        self.node.add_failure(rank, exc)
        self.ranks -= 1
        if self.ranks == 0:
            self.rt.gathers.pop(self.port, None)  # a late Gathered must not count again
            self.node.subtree_done()
            return True
        return False


def on_gathered(rt: Runtime, conn: Connection, msg: Gathered, parts: list[Buffer]) -> None:
    """Results of a subtree: into a tree node's gather, or the sender's port."""
    conn.pending.pop(msg.port, None)
    node = rt.gathers.pop(msg.port, None)
    if node is not None:
        rt.close_port(msg.port)
        node.add_gathered(msg, parts)
        return
    i = 0
    for rank, status, raw, pickled, n in msg.entries:
        rt.deliver(msg.port, rank, *decode_reply(status, raw, pickled, parts[i : i + n]))
        i += n
