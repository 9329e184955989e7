"""An actor's mailbox: the messages that wait for their turn. It owns the queue of
messages (and supervision events) not started yet, the per-sender ordering of sequenced
messages (``Call.seq``: those that came early wait for their predecessors, for at most
``config.seq_gap_timeout``), and the backpressure on senders while it is full. Whether a
message may start now, and starting it, are its owner's (:class:`MailboxOwner`, the
actor instance): the mailbox only decides the order."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence, Sized
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..config import config
from ._connection import Connection
from ._wire import Buffer, Call

if TYPE_CHECKING:
    from ._replies_out import ReplySink

__all__ = ["Event", "Letter", "Mailbox", "MailboxOwner", "Running"]

log = logging.getLogger("danaus.actor")


class Letter(NamedTuple):
    """A message waiting in the mailbox, with where it came from and its frame's parts."""

    conn: ReplySink
    msg: Call
    parts: Sequence[Buffer]


#: A supervision event: runs in mailbox order, once nothing runs before it.
Event = Callable[[], None]


class Running(Protocol):
    """What runs now, as far as the mailbox's fast path needs to know."""

    @property
    def task(self) -> object | None:
        """The task holding the mailbox, if one does."""

    @property
    def jobs(self) -> Sized:
        """Sync messages handed to the actor's thread and not reported back: they count
        towards the mailbox limit."""


class MailboxOwner(Protocol):
    """What the mailbox asks of the actor it belongs to."""

    @property
    def in_flight(self) -> Running:
        """What runs now (read once, at the mailbox's creation): while a task holds the
        mailbox nothing starts, and with no task and no jobs the next message starts at
        once; only the remaining case asks :meth:`may_start`."""

    @property
    def stopped(self) -> bool: ...

    @property
    def busy(self) -> bool:
        """A message runs and holds the mailbox (an event waits until it is done)."""

    def may_start(self, msg: Call) -> bool:
        """May ``msg`` start now, with nothing queued before it?"""

    def start(self, conn: ReplySink, msg: Call, parts: Sequence[Buffer]) -> None:
        """Run ``msg`` now (its turn has come)."""


class Mailbox:
    """The waiting messages of one actor, in the order they will run."""

    def __init__(self, owner: MailboxOwner, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._owner = owner
        self._running = owner.in_flight
        self._loop = loop
        self._name = name  # (the actor's id, for the log)
        self.queue: collections.deque[Letter | Event] = collections.deque()
        #: per sender: the next sequence number to handle, and those that came early
        #: (``None``: one the sender said will never come)
        self.expect: dict[str, int] = {}
        self.held: dict[tuple[str, int], Letter | None] = {}
        self._gap_timer: asyncio.TimerHandle | None = None
        #: connections we stopped reading from while the mailbox is full
        self.holding: set[Connection] = set()

    def __len__(self) -> int:
        return len(self.queue)

    def __repr__(self) -> str:
        return f"<Mailbox {self._name} queued={len(self.queue)} held={len(self.held)}>"

    def deliver(
        self, conn: ReplySink, msg: Call, parts: Sequence[Buffer], sender: str | None = None
    ) -> None:
        """Take a message; ``sender`` (default: the connection's peer) orders it by ``msg.seq``."""
        seq = msg.seq
        if seq:
            if sender is None:
                sender = conn.peer or ""
            expected = self.expect.get(sender, 1)
            if seq != expected:
                if seq > expected:  # an earlier one is still on its way (a cast tree)
                    self.held[(sender, seq)] = Letter(conn, msg, parts)
                    if self._gap_timer is None:
                        self._gap_timer = self._loop.call_later(
                            config.seq_gap_timeout, self._gap_expired
                        )
                return  # seq < expected: already handled or skipped
            self.expect[sender] = seq + 1
            if self.held:
                self.accept(conn, msg, parts)
                self._release(sender, seq + 1)
                return
        self.accept(conn, msg, parts)

    def skip(self, sender: str, seq: int) -> None:
        """``seq`` from ``sender`` will never come: stop waiting for it."""
        expected = self.expect.get(sender, 1)
        if seq == expected:
            self._release(sender, seq + 1)
        elif seq > expected:
            self.held[(sender, seq)] = None

    def _gap_expired(self) -> None:
        """Messages held for a predecessor that never came: stop waiting (bounded)."""
        self._gap_timer = None
        if self._owner.stopped or not self.held:
            return
        for sender in {s for s, _ in self.held}:
            expected = self.expect.get(sender, 1)
            first = min(q for s, q in self.held if s == sender)
            if first > expected:
                log.warning(
                    "%s: messages %d..%d from %s never arrived (lost with a failed "
                    "path); handling the ones after them",
                    self._name,
                    expected,
                    first - 1,
                    sender,
                )
                self._release(sender, first)
        if self.held:
            self._gap_timer = self._loop.call_later(config.seq_gap_timeout, self._gap_expired)

    def _release(self, sender: str, nxt: int) -> None:
        held = self.held
        while held and (sender, nxt) in held:
            letter = held.pop((sender, nxt))
            if letter is not None:
                self.accept(*letter)
            nxt += 1
        self.expect[sender] = nxt

    def accept(self, conn: ReplySink, msg: Call, parts: Sequence[Buffer]) -> None:
        """A message whose turn among its sender's has come: start it, or queue it."""
        owner = self._owner
        if not self.queue:
            running = self._running
            if running.task is None and (not running.jobs or owner.may_start(msg)):
                owner.start(conn, msg, parts)
                return
        self.queue.append(Letter(conn, msg, parts))
        if len(self.queue) + len(self._running.jobs) >= config.mailbox_limit and isinstance(
            conn, Connection
        ):
            # Backpressure: stop reading from this sender until the mailbox drains;
            # its socket fills, then its own writes pause (see ActorEndpoint.post).
            conn.hold_reading(self)
            self.holding.add(conn)

    def post(self, event: Event) -> None:
        """Run ``event`` after what is queued and running now (at once if nothing is)."""
        if self._owner.busy or self.queue:
            self.queue.append(event)
        else:
            event()

    def drain(self) -> None:
        """Start what may start now, in order (the owner finished something)."""
        queue = self.queue
        owner = self._owner
        while queue and not owner.stopped:
            item = queue[0]
            if isinstance(item, Letter):
                running = self._running
                if running.task is not None or (running.jobs and not owner.may_start(item.msg)):
                    break
                queue.popleft()
                owner.start(*item)
            else:
                if owner.busy:
                    break
                queue.popleft()
                item()
        if self.holding and (
            len(queue) + len(self._running.jobs) <= config.mailbox_limit // 2 or owner.stopped
        ):
            for c in self.holding:
                c.release_reading(self)
            self.holding.clear()

    def remove(self, mine: Callable[[ReplySink, Call], bool]) -> bool:
        """Drop the first queued message that is ``mine``; False if none is."""
        for i, item in enumerate(self.queue):
            if isinstance(item, Letter) and mine(item.conn, item.msg):
                del self.queue[i]
                return True
        return False

    def close(self) -> list[Letter]:
        """Take every message that waits (queued, then held for a predecessor): they will
        not run. Supervision events are dropped."""
        waiting = [item for item in self.queue if isinstance(item, Letter)]
        waiting.extend(letter for letter in self.held.values() if letter is not None)
        self.queue.clear()
        self.held.clear()
        return waiting
