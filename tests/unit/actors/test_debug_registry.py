"""The controller's registry of paused actors (``danaus.actors._debugging.sessions``): sessions from
their channels, output read with a cursor, lines typed, and holders that go away."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danaus.actors._debugging import sessions as _debug
from danaus.actors._debugging.sessions import DebugRegistry
from danaus.actors._wire import DebugDetach, DebugInput, DebugOpen, DebugOutput


class FakeConn:
    """A debug channel's connection: records what the registry sends down it."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.rt = self  # (and its runtime: the loop, the connections by peer)
        self.loop = asyncio.get_running_loop()
        self.conns: dict[str, Any] = {}
        self.sent: list[Any] = []
        self.peer_paused = False

    def set_peer_paused(self, paused: bool) -> None:
        self.peer_paused = paused

    def on_loop(self) -> bool:
        return True  # (the test's own loop)

    def open_connection(self, addr: str) -> Any:
        return self.conns.get(addr)

    def send(self, msg: Any) -> bool:
        self.sent.append(msg)
        return True


def _open(reg: DebugRegistry, conn: FakeConn, wire: int, rank: int) -> None:
    reg.opened(
        conn,  # type: ignore[arg-type]
        DebugOpen(wire, f"p[{rank}].busy[{rank}]", "busy", rank, {"procs": rank},
                  "/src/a.py:3", "step", "unix:@p", "host", 42),
    )  # fmt: skip


async def test_sessions_their_output_and_a_cursor() -> None:
    reg = DebugRegistry()
    a, b = FakeConn("unix:@a#debug-1"), FakeConn("unix:@b#debug-2")
    _open(reg, a, 7, 0)
    _open(reg, b, 7, 1)  # (the same wire number on another channel: another session)
    reg.output(a, DebugOutput(7, "> a.py(3)\n(Pdb) ", True, "/src/a.py:4", "step"))  # type: ignore[arg-type]
    s1, s2 = reg.sessions()
    assert (s1.id, s1.info.rank, s1.where, s1.state.value) == (1, 0, "/src/a.py:4", "waiting")
    assert (s2.id, s2.where, s2.state.value) == (2, "/src/a.py:3", "running")
    assert s1.record()["coords"] == {"procs": 0} and s1.record()["held"] is False
    assert repr(s1) == "<DebugSession 1 p[0].busy[0] waiting at /src/a.py:4>"
    cursor, entries, dropped = await reg.read(0, wait=0)
    kinds = [(sid, kind) for _, sid, kind, _ in entries]
    assert kinds == [(1, "open"), (2, "open"), (1, "out"), (1, "prompt")] and not dropped
    assert (await reg.read(cursor, wait=0))[1] == []
    # A long poll wakes when something new comes (from another thread, as a channel's loop).
    waiting = asyncio.ensure_future(reg.read(cursor, wait=30))
    await asyncio.to_thread(reg.output, b, DebugOutput(7, "hi\n"))  # type: ignore[arg-type]
    _, new, _ = await asyncio.wait_for(waiting, 10)
    assert [(sid, kind, text) for _, sid, kind, text in new] == [(2, "out", "hi\n")]
    # The paused proc said its loop is paused; its session's channel then breaks: it may
    # be frozen, so its silence counts again.
    main = b.conns["unix:@p"] = FakeConn("unix:@p")
    main.peer_paused = True
    reg.closed(a, 7)  # type: ignore[arg-type]
    assert main.peer_paused  # (a session that ended well changes nothing)
    reg.lost(b, "unix:@b#debug-2")  # type: ignore[arg-type]
    assert main.peer_paused is False
    assert reg.sessions() == []
    assert [k for _, _, k, _ in (await reg.read(cursor, wait=0))[1]][-2:] == ["close", "close"]


async def test_typed_lines_go_down_their_channel_and_attach_shows_the_last_output() -> None:
    reg = DebugRegistry()
    a = FakeConn("unix:@a#debug-1")
    _open(reg, a, 7, 0)
    reg.output(a, DebugOutput(7, "> a.py(3)\n(Pdb) ", True))  # type: ignore[arg-type]
    session, backlog, _ = reg.attach(1, "me")
    assert backlog == "> a.py(3)\n(Pdb) " and session.holder == "me"
    assert reg.send([1], "p x", "me") == [1]
    assert a.sent == [DebugInput(7, "p x")]
    assert reg.attach(1, "me")[1] == ""  # (what came before the last input is not shown again)
    with pytest.raises(ValueError, match="one line"):
        reg.send([1], "p x\np y")
    with pytest.raises(LookupError, match="no open debugger session 5"):
        reg.send([5], "c")
    assert reg.detach() == [1] and a.sent[-1] == DebugDetach(7)


async def test_a_holder_that_stops_polling_lets_its_sessions_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reg = DebugRegistry()
    a, b = FakeConn("unix:@a#debug-1"), FakeConn("unix:@b#debug-2")
    _open(reg, a, 1, 0)
    _open(reg, b, 2, 1)
    reg.send([1], "n", "gone")
    reg.send([2], "n", "quitter")
    reg.release("quitter")  # quit: it stays paused, held by nobody
    reg.sweep()
    assert a.sent == [DebugInput(1, "n")]  # (held, and its holder polled just now)
    monkeypatch.setattr(_debug, "HOLD", -1.0)  # every holder has been silent too long
    reg.sweep()
    assert a.sent[-1] == DebugDetach(1)
    assert b.sent == [DebugInput(2, "n")]  # released: nobody held it, it waits
    assert [s.record()["held"] for s in reg.sessions()] == [False, False]
