"""``danaus debug``'s commands: parsing, which sessions a cast reaches, the list table,
and the prompt's answers to mistakes (with a fake admin endpoint: no processes)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from danaus.tools._debug_commands import (
    Attach,
    Cast,
    CommandError,
    Continue,
    Empty,
    Help,
    ListSessions,
    Quit,
    matches,
    parse_command,
    parse_ranks,
    select,
)
from danaus.tools.debug import DebugCli, _prefixed, format_sessions


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("", Empty()),
        ("   ", Empty()),
        ("list", ListSessions()),
        ("l", ListSessions()),
        ("help", Help()),
        ("h", Help()),
        ("quit", Quit()),
        ("q", Quit()),
        ("continue", Continue()),
        ("c", Continue()),
        ("attach busy 3", Attach("busy", 3)),
        ("a busy 0", Attach("busy", 0)),
        ("attach busy[2]", Attach("busy", 2)),
        ("  attach   my-mesh.v2   7  ", Attach("my-mesh.v2", 7)),
        ("cast * c", Cast(None, None, "c")),
        ("cast * p x + 1", Cast(None, None, "p x + 1")),
        ("cast busy n", Cast("busy", None, "n")),
        ("cast busy[0,1] continue", Cast("busy", (0, 1), "continue")),
        ("cast busy[3] n", Cast("busy", (3,), "n")),
        ("cast busy ranks(1) p secret", Cast("busy", (1,), "p secret")),
        ("cast busy ranks(1,4,6) s", Cast("busy", (1, 4, 6), "s")),
        ("cast busy ranks(2:7:2) s", Cast("busy", range(2, 7, 2), "s")),
        ("cast busy ranks(:3) s", Cast("busy", range(0, 3), "s")),
        ("cast busy ranks(4:) s", Cast("busy", range(4, sys.maxsize), "s")),
        (
            "cast busy ranks(hosts=2:4, gpus=1) n",
            Cast("busy", {"hosts": range(2, 4), "gpus": 1}, "n"),
        ),
        (
            "cast busy ranks(hosts=0, gpus=(1,3)) p (a, b)",
            Cast("busy", {"hosts": 0, "gpus": (1, 3)}, "p (a, b)"),
        ),
    ],
)
def test_a_line_parses_to_its_command(line: str, command: Any) -> None:
    assert parse_command(line) == command


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("frobnicate", "unknown command"),
        ("list all", "unknown command"),
        ("attach busy", "attach takes a mesh and a rank"),
        ("attach busy x", "attach takes a mesh and a rank"),
        ("attach", "attach takes a mesh and a rank"),
        ("cast busy", "cast takes a target and a pdb command"),
        ("cast", "cast takes a target and a pdb command"),
        ("cast *[0] n", "it takes no ranks"),
        ("cast * ranks(0) n", "it takes no ranks"),
        ("cast busy[] n", "empty ranks"),
        ("cast busy[a] n", "is not a rank"),
        ("cast busy ranks(1:2:3:4) n", "is not a range"),
        ("cast busy ranks(0:4:0) n", "step cannot be 0"),
        ("cast busy ranks(hosts=1, hosts=2) n", "given twice"),
        ("cast busy ranks(hosts=x) n", "is not a rank, a range"),
    ],
)
def test_a_bad_line_says_what_is_wrong(line: str, says: str) -> None:
    with pytest.raises(CommandError, match=says):
        parse_command(line)


def test_ranks_select_by_linear_rank_or_by_coordinates() -> None:
    assert parse_ranks("0, 2") == (0, 2)
    assert matches(None, 5, {})
    assert matches((1, 3), 3, {}) and not matches((1, 3), 2, {})
    assert matches(range(0, 10, 2), 4, {}) and not matches(range(0, 10, 2), 5, {})
    where = {"hosts": 1, "gpus": 3}
    assert matches({"hosts": 1}, 7, where)
    assert matches({"hosts": range(0, 2), "gpus": (1, 3)}, 7, where)
    assert not matches({"hosts": 0}, 7, where)
    assert not matches({"racks": 0}, 7, where)  # a dim the actor's mesh does not have


def _session(sid: int, mesh: str, rank: int, **coords: int) -> dict[str, Any]:
    return {
        "id": sid,
        "mesh": mesh,
        "rank": rank,
        "coords": coords,
        "actor": f"procs[{rank}].{mesh}[{rank}]",
        "where": f"/src/train.py:{10 + rank}",
        "function": "step",
        "state": "waiting",
        "reason": "breakpoint",
    }


def test_a_cast_reaches_the_sessions_it_names() -> None:
    sessions = [
        _session(1, "busy", 0, hosts=0, gpus=0),
        _session(2, "busy", 1, hosts=0, gpus=1),
        _session(3, "busy", 2, hosts=1, gpus=0),
        _session(4, "other", 1, procs=1),
    ]
    assert select(sessions, parse_command("cast * n")) == [1, 2, 3, 4]  # type: ignore[arg-type]
    assert select(sessions, parse_command("cast busy n")) == [1, 2, 3]  # type: ignore[arg-type]
    assert select(sessions, parse_command("cast busy[1,2] n")) == [2, 3]  # type: ignore[arg-type]
    assert select(sessions, parse_command("cast busy ranks(gpus=0) n")) == [1, 3]  # type: ignore[arg-type]
    assert select(sessions, parse_command("cast other[0] n")) == []  # type: ignore[arg-type]


def test_the_list_table_names_each_paused_actor_and_where() -> None:
    assert format_sessions([]) == "no actor is paused\n"
    table = format_sessions([_session(1, "busy", 0), _session(12, "busy", 1)])
    lines = table.splitlines()
    assert lines[0].split() == ["ID", "MESH", "RANK", "ACTOR", "WHERE", "FUNCTION", "STATE", "WHY"]
    assert lines[1].split() == [
        "1", "busy", "0", "procs[0].busy[0]", "/src/train.py:10", "step", "waiting", "breakpoint",
    ]  # fmt: skip
    assert lines[1].index("/src") == lines[2].index("/src")  # (columns line up)


def test_cast_output_is_prefixed_line_by_line_and_the_prompt_dropped() -> None:
    partial: dict[int, str] = {}
    assert _prefixed("busy 0", partial, 1, "40\n(Pdb) ") == "[busy 0] 40\n"
    assert partial == {}
    assert _prefixed("busy 1", partial, 2, "> a.py(3)f()\n-> x") == "[busy 1] > a.py(3)f()\n"
    assert _prefixed("busy 1", partial, 2, " = 1\n") == "[busy 1] -> x = 1\n"


class FakeAdmin:
    """An admin endpoint with canned sessions, recording what was asked."""

    addr = "unix:@fake"

    def __init__(self, sessions: list[dict[str, Any]]) -> None:
        self.session_list = sessions
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, op: str, **args: Any) -> Any:
        self.calls.append((op, args))
        if op == "debug.list":
            return {"cursor": 0, "sessions": self.session_list}
        if op == "debug.read":
            return {"cursor": 0, "entries": [], "dropped": False}
        if op == "debug.continue":
            return {"continued": [s["id"] for s in self.session_list]}
        return {}

    def close(self) -> None:
        pass


def _cli(lines: list[str], sessions: list[dict[str, Any]]) -> tuple[str, FakeAdmin, int]:
    admin = FakeAdmin(sessions)
    out = io.StringIO()
    feed = iter(lines)

    def read_line(prompt: str) -> str:
        out.write(prompt)
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    cli = DebugCli(lambda: admin, out, read_line)  # type: ignore[arg-type,return-value]
    status = cli.run()
    return out.getvalue(), admin, status


def test_the_prompt_answers_mistakes_and_leaves_the_sessions_paused_on_quit() -> None:
    text, admin, status = _cli(
        ["bogus", "attach busy 9", "cast nobody n", "help", "list", "continue", "quit"],
        [_session(1, "busy", 0)],
    )
    assert status == 0
    assert "unknown command 'bogus'" in text
    assert "no paused actor at busy 9" in text
    assert "no paused actor matches" in text
    assert "cast <mesh> ranks(R) <cmd>" in text  # the help
    assert "procs[0].busy[0]" in text  # the list
    assert "continued 1 paused actor(s)" in text
    ops = [op for op, _ in admin.calls if op != "debug.read"]
    assert "debug.send" not in ops  # nothing was typed into a session
    assert ops[-1] == "debug.release"  # quit: its sessions stay paused, held by nobody
