"""What danaus top draws from a snapshot, and what its keys do: no terminal needed."""

from __future__ import annotations

from typing import Any

import pytest

from danaus.tools._top_model import StackPane, View, actor_rows, sorted_rows
from danaus.tools._top_render import Line, handle_key, render, stack_lines


def _actor(
    mesh: str,
    rank: int,
    *,
    handled: int = 0,
    errors: int = 0,
    mailbox: int = 0,
    running: list[tuple[str, float]] | None = None,
    health: str = "idle",
) -> dict[str, Any]:
    running = running or []
    return {
        "actor": f"procs[{rank}].{mesh}[{rank}]",
        "mesh": mesh,
        "rank": rank,
        "handled": {"step": handled} if handled else {},
        "errors": {"step": errors} if errors else {},
        "last_failure": "step: ValueError: bad" if errors else None,
        "mailbox": mailbox,
        "in_flight": len(running),
        "running": running,
        "failed": False,
        "stopped": False,
        "procs": "procs",
        "proc_rank": rank,
        "health": health,
    }


def _proc(rank: int, pid: int, cpu: float, health: str = "ok") -> dict[str, Any]:
    proc: dict[str, Any] = {
        "rank": rank,
        "point": f"{{'procs': {rank}/3}}",
        "addr": f"unix:@p{rank}",
        "health": health,
        "failure": None,
        "error": None,
        "pid": pid,
    }
    if health == "failed":
        proc["failure"] = f"proc unix:@p{rank} killed by SIGKILL"
    else:
        proc.update(
            host="node7",
            cpu_percent=cpu,
            rss_bytes=300 << 20,
            connections=2,
            bytes_in=5000,
            bytes_out=1 << 30,
        )
    return proc


def _snapshot() -> dict[str, Any]:
    """Three procs; the third was killed, so its actor is known only as a failed rank."""
    return {
        "time": 1000.0 + 3725,
        "controller": {
            "pid": 4242,
            "host": "head",
            "argv": ["train.py", "--lr=3"],
            "started": 1000.0,
        },
        "proc_meshes": [
            {
                "name": "procs",
                "sizes": {"procs": 3},
                "failed": {"2": "proc unix:@p2 killed by SIGKILL"},
                "procs": [_proc(0, 101, 12.5), _proc(1, 102, 95.0), _proc(2, 103, 0.0, "failed")],
                "actor_meshes": [
                    {
                        "name": "trainer",
                        "ranks": [0, 1, 2],
                        "failed": {"2": "proc unix:@p2 killed by SIGKILL"},
                        "stopped": None,
                    }
                ],
            }
        ],
        "actors": [
            _actor("trainer", 0, handled=10, mailbox=1, running=[("step", 2.5)], health="busy"),
            _actor("trainer", 1, handled=3, errors=2, mailbox=7),
        ],
        "stuck": [],
        "failures": [{"mesh": "trainer", "ranks": [2], "kind": "proc", "report": "killed"}],
    }


def _actor_lines(lines: list[Line]) -> list[Line]:
    return [ln for ln in lines if ".trainer[" in ln.text]


def _order(view: View, width: int = 160, height: int = 40) -> list[str]:
    lines = _actor_lines(render(_snapshot(), view, width, height))
    return [ln.text.split()[1 if ln.selected else 0] for ln in lines]


def test_the_screen_shows_the_controller_its_procs_and_its_actors() -> None:
    lines = render(_snapshot(), View(source="unix:@x"), 160, 40)
    text = "\n".join(ln.text for ln in lines)
    assert "controller pid 4242 on head" in lines[0].text
    assert "up 1:02:05" in lines[0].text
    assert "train.py --lr=3" in text
    assert "proc meshes 1  procs 3 (1 failed)  actors 3 (1 failed)  failures 1  stuck 0" in text
    proc_row = next(ln.text for ln in lines if " 102 " in ln.text)
    assert proc_row.split() == [
        "procs",
        "1",
        "102",
        "node7",
        "ok",
        "95.0",
        "300M",
        "2",
        "4.9K",
        "1.0G",
    ]
    assert all(len(ln.text) <= 160 for ln in lines)


def test_failed_rows_are_marked_in_words_and_style() -> None:
    lines = render(_snapshot(), View(), 160, 40)
    dead_proc = next(ln for ln in lines if " 103 " in ln.text)
    assert dead_proc.style == "failed" and "failed" in dead_proc.text
    assert "killed by SIGKILL" in dead_proc.text
    # the dead proc's actor cannot answer: it is shown from its mesh's failed ranks
    (lost,) = [ln for ln in _actor_lines(lines) if "procs[2].trainer[2]" in ln.text]
    assert lost.style == "failed"
    assert lost.text.split()[1:8] == ["trainer", "2", "failed", "-", "-", "-", "-"]
    busy = next(ln for ln in _actor_lines(lines) if "procs[0]" in ln.text)
    assert busy.style == "plain" and "step 2.5s" in busy.text


def test_sorting_by_each_key_and_pressing_again_reverses() -> None:
    view = View()
    names = ["procs[0].trainer[0]", "procs[1].trainer[1]", "procs[2].trainer[2]"]
    assert _order(view) == names
    rows = actor_rows(_snapshot())
    a, b, c = names
    # (figures largest first, then reversed; ties stay in name order both ways)
    expected = {
        "m": ([b, a, c], [c, a, b]),  # mailboxes 1, 7, -
        "h": ([a, b, c], [c, b, a]),  # handled 10, 3, -
        "e": ([b, a, c], [a, c, b]),  # errors 0, 2, -
        "c": ([b, a, c], [c, a, b]),  # their procs' CPU 12.5, 95, 0
        "r": ([a, b, c], [b, c, a]),  # running 2.5 s, -, -
    }
    for key, (order, reverse) in expected.items():
        assert handle_key(view, key, rows, 10) is None
        assert _order(view) == order, key
        handle_key(view, key, rows, 10)
        assert view.reverse
        assert _order(view) == reverse, key
    handle_key(view, "n", rows, 10)
    handle_key(view, "n", rows, 10)
    assert _order(view) == names[::-1]
    assert "sort: name descending" in render(_snapshot(), view, 160, 40)[2].text


def test_sorting_by_cpu_orders_the_procs_too() -> None:
    view = View()
    handle_key(view, "c", [], 10)
    pids = [ln.text.split()[2] for ln in render(_snapshot(), view, 160, 40) if " node7 " in ln.text]
    assert pids == ["102", "101"]


def test_names_sort_by_their_numbers() -> None:
    rows = actor_rows({"actors": [_actor("a", r) for r in (10, 2, 1)], "proc_meshes": []})
    assert [r.rank for r in sorted_rows(rows, View())] == [1, 2, 10]


def test_the_selection_moves_and_follows_its_actor_when_the_order_changes() -> None:
    view = View()
    rows = actor_rows(_snapshot())
    lines = _actor_lines(render(_snapshot(), view, 160, 40))
    assert [ln.selected for ln in lines] == [True, False, False]
    assert lines[0].text.startswith("> ")
    handle_key(view, "down", rows, 10)
    handle_key(view, "j", rows, 10)
    handle_key(view, "j", rows, 10)  # past the end: stays on the last
    assert view.selected == "procs[2].trainer[2]"
    handle_key(view, "k", rows, 10)
    assert view.selected == "procs[1].trainer[1]"
    handle_key(view, "m", rows, 10)  # trainer[1] has the fullest mailbox: it moves first
    lines = _actor_lines(render(_snapshot(), view, 160, 40))
    assert lines[0].selected and "procs[1].trainer[1]" in lines[0].text
    handle_key(view, "end", rows, 10)
    handle_key(view, "home", rows, 10)
    assert view.selected == "procs[1].trainer[1]"


def test_many_actors_scroll_to_keep_the_selection_on_screen() -> None:
    snap = _snapshot()
    snap["actors"] = [_actor("trainer", r) for r in range(200)]
    snap["proc_meshes"][0]["actor_meshes"][0]["failed"] = {}
    view = View()
    rows = actor_rows(snap)
    for _ in range(150):
        handle_key(view, "down", rows, 10)
    lines = render(snap, view, 120, 30)
    assert len(lines) == 30
    assert sum(ln.selected for ln in lines) == 1
    assert "procs[150].trainer[150]" in next(ln.text for ln in lines if ln.selected)
    handle_key(view, "pgdn", rows, 100)
    assert view.selected == "procs[199].trainer[199]"


def test_many_procs_leave_room_for_the_actors() -> None:
    snap = _snapshot()
    snap["proc_meshes"][0]["procs"] = [_proc(r, 1000 + r, 1.0) for r in range(100)]
    lines = render(snap, View(), 120, 30)
    assert len(lines) <= 30
    assert any("more procs" in ln.text for ln in lines)
    assert len(_actor_lines(lines)) == 3


@pytest.mark.parametrize(("width", "height"), [(0, 0), (1, 1), (5, 3), (20, 8), (40, 2), (200, 1)])
def test_small_screens_truncate_without_crashing(width: int, height: int) -> None:
    for view in (View(), View(stacks=StackPane("procs[0].trainer[0]", "procs", 0))):
        lines = render(_snapshot(), view, width, height)
        assert len(lines) <= height
        assert all(len(ln.text) <= width for ln in lines)
        if width >= 5 and height >= 1:
            assert lines[0].text


def test_long_cells_are_cut_and_marked_and_odd_characters_replaced() -> None:
    snap = _snapshot()
    snap["actors"][0]["actor"] = "procs[0]." + "x" * 80 + "\tend\x1b[31m"
    lines = render(snap, View(), 200, 40)
    row = next(ln.text for ln in lines if "xxxx" in ln.text)
    assert "x~ " in row
    assert all(" " <= c <= "~" for ln in lines for c in ln.text)


def test_before_the_first_snapshot_it_says_it_is_waiting() -> None:
    lines = render(None, View(source="unix:@x", status="controller not answering for 7 s"), 80, 10)
    assert "waiting for the controller" in lines[0].text
    assert any(ln.style == "warn" and "not answering" in ln.text for ln in lines)


STACKS = [
    {"thread": "MainThread", "stack": '  File "proc.py", line 1, in run\n    loop.run()\n'},
    {
        "thread": "danaus-actor procs[0].trainer[0]",
        "actor": "procs[0].trainer[0]",
        "endpoint": "step",
        "seconds": 12.25,
        "stack": '  File "train.py", line 9, in step\n    gate.wait()\n',
    },
    {
        "task": "Task-7",
        "actor": "procs[0].other[0]",
        "endpoint": "poll",
        "seconds": 1.0,
        "stack": '  File "other.py", line 3, in poll\n    await x\n',
    },
]


def test_s_opens_the_selected_actors_stack_its_entries_first() -> None:
    view = View()
    rows = actor_rows(_snapshot())
    assert handle_key(view, "s", rows, 10) == "stacks"
    pane = view.stacks
    assert pane is not None and (pane.actor, pane.procs, pane.rank) == (
        "procs[0].trainer[0]",
        "procs",
        0,
    )
    assert "asking procs[0]" in "\n".join(ln.text for ln in render(None, view, 100, 20))
    pane.entries = STACKS
    texts = [ln.text for ln in render(_snapshot(), view, 100, 20)]
    assert texts[0].startswith("stacks of procs[0], for procs[0].trainer[0]")
    body = texts[3:]
    assert (
        body[0] == "thread danaus-actor procs[0].trainer[0]  procs[0].trainer[0] step running 12.2s"
    )
    assert body[2] == "      gate.wait()"
    assert any(t.startswith("thread MainThread") for t in body)
    assert any(t.startswith("task Task-7  procs[0].other[0] poll") for t in body)
    # sort keys do not apply here: q goes back, it does not quit
    assert handle_key(view, "q", rows, 10) is None and view.stacks is None


def test_the_stack_scrolls_within_bounds_and_esc_or_s_go_back() -> None:
    view = View()
    rows = actor_rows(_snapshot())
    handle_key(view, "s", rows, 5)
    assert view.stacks is not None
    view.stacks.entries = STACKS
    total = len(stack_lines(view.stacks))
    handle_key(view, "up", rows, 5)
    assert view.stacks.scroll == 0
    handle_key(view, "pgdn", rows, 5)
    assert view.stacks.scroll == 5
    first = render(_snapshot(), view, 100, 8)[3].text
    assert first == stack_lines(view.stacks)[5].text
    for _ in range(50):
        handle_key(view, "j", rows, 5)
    assert view.stacks.scroll == total - 5
    handle_key(view, "home", rows, 5)
    assert view.stacks.scroll == 0
    assert handle_key(view, "r", rows, 5) == "stacks" and view.stacks.entries is None
    handle_key(view, "esc", rows, 5)
    assert view.stacks is None
    handle_key(view, "s", rows, 5)
    handle_key(view, "s", rows, 5)
    assert view.stacks is None


def test_an_actor_running_nothing_and_a_refusal_are_said() -> None:
    pane = StackPane("procs[1].trainer[1]", "procs", 1, entries=STACKS[:1])
    assert "runs no endpoint now" in stack_lines(pane)[0].text
    pane = StackPane("procs[2].trainer[2]", "procs", 2, error="KeyError: no rank 2")
    (line,) = stack_lines(pane)
    assert line.style == "failed" and "KeyError: no rank 2" in line.text


def test_q_quits_and_other_keys_do_nothing() -> None:
    view = View()
    rows = actor_rows(_snapshot())
    assert handle_key(view, "x", rows, 10) is None
    assert handle_key(view, "", [], 10) is None
    assert handle_key(view, "s", [], 10) is None and view.stacks is None
    assert handle_key(view, "q", rows, 10) == "quit"


def _trainer(name: str, **over: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "name": name,
        "procs": "procs",
        "state": "ready",
        "error": None,
        "started": 1000.0,
        "plan": {"strategy": "dp=2 x pp=2", "estimated_step_s": 0.19},
        "steps": 120,
        "history": [[119, 2.5, 17000.0, 0.22], [120, 2.31456, 18400.0, 0.21]],
        "recoveries": [],
    }
    return {**t, **over}


def test_the_trainers_are_shown_with_their_steps_loss_and_recoveries() -> None:
    recovered = {
        "step": 40,
        "lost": [2],
        "why": "proc unix:@p2 killed by SIGKILL\nmore",
        "action": "respawn",
        "total_s": 3.14,
    }
    snap = {
        **_snapshot(),
        "sections": {
            "trainers": [
                _trainer("trainer 1a"),
                _trainer("trainer 2b", recoveries=[recovered]),
                _trainer("trainer 3c", state="failed", error="ValueError: bad\nTraceback"),
            ]
        },
    }
    lines = render(snap, View(source="unix:@x"), 240, 40)
    by_name = {ln.text.split("  ")[0]: ln for ln in lines if ln.text.startswith("trainer ")}
    first = by_name["trainer 1a"]
    assert first.text == (
        "trainer 1a  ready  dp=2 x pp=2  step 120  loss 2.315  18,400 tok/s  0.21 s/step (est 0.19)"
    )
    assert first.style == "plain"
    second = by_name["trainer 2b"]
    assert second.text.endswith(
        "recoveries 1, last: after step 40 lost [2] (proc unix:@p2 killed by SIGKILL), respawn, 3.1 s"
    )
    assert second.style == "warn"
    third = by_name["trainer 3c"]
    assert third.style == "failed" and third.text.endswith("ValueError: bad")
    # the procs and the actors are still there, below
    assert any(" 102 " in ln.text for ln in lines) and _actor_lines(lines)


def test_many_trainers_take_three_lines_and_a_broken_section_is_said() -> None:
    snap = {**_snapshot(), "sections": {"trainers": [_trainer(f"trainer {i}") for i in range(5)]}}
    text = [ln.text for ln in render(snap, View(source="unix:@x"), 200, 40)]
    assert [t for t in text if t.startswith("trainer ")] == [
        t for t in text if t.startswith(("trainer 0", "trainer 1"))
    ]
    assert "  ... 3 more trainers" in text
    broken = {**_snapshot(), "sections": {"trainers": {"error": "KeyError: 'plan'"}}}
    lines = render(broken, View(source="unix:@x"), 200, 40)
    [said] = [ln for ln in lines if ln.text.startswith("trainers:")]
    assert said.text == "trainers: KeyError: 'plan'" and said.style == "warn"
    # no section at all (a controller with no trainer): nothing said
    assert not [
        ln for ln in render(_snapshot(), View(source="x"), 200, 40) if "trainer " in ln.text[:8]
    ]


def test_odd_trainer_data_is_drawn_not_fatal() -> None:
    # a diverged loss (NaN crosses the admin endpoint's JSON as null), fields of the wrong
    # type, an entry that is not a trainer: the screen still draws, saying what it can
    odd = [
        _trainer("trainer nan", history=[[3, None, None, 0.2]]),
        _trainer("trainer bad", plan="?", history={"a": 1}, recoveries=[{"total_s": "x"}]),
        "not a trainer",
    ]
    snap = {**_snapshot(), "sections": {"trainers": odd}}
    text = [ln.text for ln in render(snap, View(source="x"), 240, 40)]
    [nan] = [t for t in text if t.startswith("trainer nan")]
    assert "loss ?" in nan and "tok/s" not in nan
    [bad] = [t for t in text if t.startswith("trainer bad")]
    assert bad.endswith("? s") and "recoveries 1" in bad
    assert any(t.startswith("trainer: unreadable ('not a trainer')") for t in text)
    assert render({**_snapshot(), "sections": "?"}, View(source="x"), 240, 40)
