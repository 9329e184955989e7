"""Tests of danaus.actors._mailbox: the order messages start in, alone (a fake owner)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import msgspec
import pytest

from danaus.actors._connection import Connection
from danaus.actors._mailbox import Letter, Mailbox
from danaus.actors._wire import Buffer, Call
from danaus.config import config


class FakeConn(Connection):
    """Stands in for a Connection (no runtime, no socket): who holds its reading."""

    def __init__(self, peer: str = "peer") -> None:  # (no super().__init__: no runtime)
        self.peer = peer
        self.holders: set[object] = set()

    def hold_reading(self, holder: object) -> None:
        self.holders.add(holder)

    def release_reading(self, holder: object) -> None:
        self.holders.discard(holder)


class Running:
    """What runs now: ``task`` set while the owner is busy."""

    def __init__(self) -> None:
        self.task: object | None = None
        self.jobs: tuple[object, ...] = ()


class Owner:
    """A MailboxOwner that records what it started; ``busy`` holds the mailbox."""

    def __init__(self) -> None:
        self.stopped = False
        self.in_flight = Running()
        self.started: list[str] = []
        #: resolved at the next start
        self.next_start: asyncio.Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self.in_flight.task is not None

    @busy.setter
    def busy(self, value: bool) -> None:
        self.in_flight.task = object() if value else None

    def may_start(self, msg: Call) -> bool:
        return not self.busy

    def start(self, conn: Connection, msg: Call, parts: Sequence[Buffer]) -> None:
        self.started.append(msg.method)
        if self.next_start is not None and not self.next_start.done():
            self.next_start.set_result(None)


def call(method: str, seq: int = 0, reply: int = 0) -> Call:
    return Call("a", method, reply, msgspec.Raw(b"\x90"), False, seq)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def box(loop: asyncio.AbstractEventLoop) -> tuple[Mailbox, Owner]:
    owner = Owner()
    return Mailbox(owner, loop, "a[0]"), owner


def deliver(
    box: Mailbox, msg: Call, conn: Connection | None = None, sender: str | None = None
) -> None:
    box.deliver(conn if conn is not None else FakeConn(), msg, [], sender)


def test_unsequenced_messages_start_at_once(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    deliver(mb, call("a"))
    deliver(mb, call("b"))
    assert owner.started == ["a", "b"]
    assert len(mb) == 0


def test_busy_owner_queues_then_drain_runs_in_order(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    owner.busy = True
    deliver(mb, call("a"))
    deliver(mb, call("b"))
    assert owner.started == [] and len(mb) == 2
    assert repr(mb) == "<Mailbox a[0] queued=2 held=0>"
    owner.busy = False
    mb.drain()
    assert owner.started == ["a", "b"]


def test_early_sequence_numbers_wait_for_their_predecessor(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    deliver(mb, call("third", seq=3), sender="s")
    deliver(mb, call("second", seq=2), sender="s")
    assert owner.started == [] and repr(mb) == "<Mailbox a[0] queued=0 held=2>"
    deliver(mb, call("first", seq=1), sender="s")
    assert owner.started == ["first", "second", "third"]
    deliver(mb, call("again", seq=2), sender="s")  # already handled: dropped
    assert owner.started == ["first", "second", "third"]


def test_skipped_sequence_number_releases_the_ones_after(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    deliver(mb, call("second", seq=2), sender="s")
    mb.skip("s", 1)
    assert owner.started == ["second"]
    mb.skip("s", 4)  # not yet due: remembered
    deliver(mb, call("third", seq=3), sender="s")
    deliver(mb, call("fifth", seq=5), sender="s")
    assert owner.started == ["second", "third", "fifth"]


def test_a_gap_that_never_fills_is_given_up(
    box: tuple[Mailbox, Owner],
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mb, owner = box
    monkeypatch.setattr(config, "seq_gap_timeout", 0.0)
    owner.next_start = loop.create_future()
    deliver(mb, call("third", seq=3), sender="s")
    assert owner.started == []
    loop.run_until_complete(asyncio.wait_for(owner.next_start, 5))
    assert owner.started == ["third"]
    deliver(mb, call("second", seq=2), sender="s")  # too late: given up on
    assert owner.started == ["third"]


def test_event_waits_until_the_owner_is_not_busy(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    ran: list[str] = []
    owner.busy = True
    deliver(mb, call("a"))
    mb.post(lambda: ran.append("event"))
    assert ran == []
    owner.busy = False
    mb.drain()
    assert owner.started == ["a"] and ran == ["event"]
    mb.post(lambda: ran.append("now"))
    assert ran == ["event", "now"]


def test_full_mailbox_holds_the_sender_until_it_drains(
    box: tuple[Mailbox, Owner], monkeypatch: pytest.MonkeyPatch
) -> None:
    mb, owner = box
    monkeypatch.setattr(config, "mailbox_limit", 4)
    conn = FakeConn()
    owner.busy = True
    for i in range(4):
        deliver(mb, call(f"m{i}"), conn)
    assert conn.holders == {mb}
    owner.busy = False
    mb.drain()
    assert conn.holders == set() and owner.started == ["m0", "m1", "m2", "m3"]


def test_remove_and_close(box: tuple[Mailbox, Owner]) -> None:
    mb, owner = box
    owner.busy = True
    deliver(mb, call("a", reply=1))
    deliver(mb, call("b", reply=2))
    mb.post(lambda: None)
    deliver(mb, call("late", seq=2, reply=3), sender="s")
    assert mb.remove(lambda c, m: m.reply == 1)
    assert not mb.remove(lambda c, m: m.reply == 9)
    left = mb.close()
    assert [letter.msg.method for letter in left] == ["b", "late"]
    assert all(isinstance(letter, Letter) for letter in left)
    assert len(mb) == 0 and repr(mb) == "<Mailbox a[0] queued=0 held=0>"
