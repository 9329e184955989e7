"""What ``danaus top`` draws, and what its keys do: pure functions of a snapshot (the
admin endpoint's ``snapshot`` op, plain JSON), a :class:`~danaus.tools._top_model.View`
and the terminal's size, so that they are tested without a terminal.

:func:`render` gives the screen as :class:`Line` s, each at most ``width`` characters of
printable ASCII with a style that the terminal side turns into colour or reverse video;
everything that matters is also in the text (``>`` marks the selected row, a failed row
says ``failed``), so a terminal without colours loses nothing.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from ._top_model import (
    SORT_LETTERS,
    Action,
    ActorRow,
    StackPane,
    View,
    actor_rows,
    selected_index,
    sorted_rows,
)

__all__ = ["Line", "Style", "handle_key", "render", "stack_lines"]

Style = Literal["plain", "title", "heading", "failed", "warn"]

HELP = "keys: up/down j/k select  n m c h e r sort  s stack  q quit"
STACK_HELP = "up/down j/k PgUp/PgDn scroll  r ask again  esc/s/q back"


class Line(NamedTuple):
    """One line of the screen."""

    text: str
    style: Style = "plain"
    selected: bool = False


# ------------------------------------------------------------------------------- format


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, a cut marked with ``~``."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + "~"


def _printable(text: str) -> str:
    text = text.expandtabs(4)
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _bytes(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "" or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return "-"  # (not reached)


def _duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    days, s = divmod(s, 86400)
    text = f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}d {text}" if days else text


class _Col(NamedTuple):
    title: str
    width: int
    right: bool = False


def _cells(cols: list[_Col], values: list[str], mark: str = " ") -> str:
    out = []
    for col, value in zip(cols, values, strict=True):
        if col.width == 0:  # the last, free column
            out.append(value)
            continue
        cell = _fit(value, col.width)
        out.append(cell.rjust(col.width) if col.right else cell.ljust(col.width))
    return (mark + " " + " ".join(out)).rstrip()


_PROC_COLS = [
    _Col("MESH", 12),
    _Col("RANK", 4, True),
    _Col("PID", 8, True),
    _Col("HOST", 14),
    _Col("HEALTH", 12),
    _Col("CPU%", 6, True),
    _Col("RSS", 7, True),
    _Col("CONNS", 5, True),
    _Col("IN", 7, True),
    _Col("OUT", 7, True),
    _Col("NOTE", 0),
]


def _actor_cols(rows: list[ActorRow]) -> list[_Col]:
    widest = max((len(r.actor) for r in rows), default=0)
    return [
        _Col("ACTOR", min(max(widest, 12), 40)),
        _Col("MESH", 12),
        _Col("RANK", 4, True),
        _Col("HEALTH", 7),
        _Col("HANDLED", 8, True),
        _Col("ERRORS", 6, True),
        _Col("MAILBOX", 7, True),
        _Col("INFLT", 5, True),
        _Col("RUNNING", 0),
    ]


def _health_style(health: str) -> Style:
    if health == "failed":
        return "failed"
    if health in ("stuck", "unresponsive", "paused"):
        return "warn"
    return "plain"


def _proc_lines(snap: dict[str, Any], view: View) -> list[Line]:
    procs = [(pm["name"], p) for pm in snap.get("proc_meshes", []) for p in pm.get("procs", [])]
    if view.sort == "cpu":
        procs.sort(key=lambda mp: float(mp[1].get("cpu_percent") or 0.0), reverse=not view.reverse)
    lines = []
    for mesh, p in procs:
        health = str(p.get("health", "?"))
        cpu = p.get("cpu_percent")
        values = [
            mesh,
            str(p.get("rank", "?")),
            str(p.get("pid") or "-"),
            str(p.get("host") or "-"),
            health,
            "-" if cpu is None else f"{float(cpu):.1f}",
            _bytes(p.get("rss_bytes")),
            str(p.get("connections", "-")),
            _bytes(p.get("bytes_in")),
            _bytes(p.get("bytes_out")),
            _first_line(p.get("failure") or p.get("error") or ""),
        ]
        lines.append(Line(_cells(_PROC_COLS, values), _health_style(health)))
    return lines


def _trainer_lines(snap: dict[str, Any]) -> list[Line]:
    """One line per ``danaus.parallel`` trainer of the controller (the snapshot's
    ``trainers`` section): its state and layout, the steps run, the latest loss, tokens/s
    and step time against the plan's estimate, and its recoveries from lost procs, the
    latest said."""
    sections = snap.get("sections")
    trainers = sections.get("trainers") if isinstance(sections, dict) else None
    if isinstance(trainers, dict) and trainers.get("error"):
        return [Line(f"trainers: {_first_line(str(trainers['error']))}", "warn")]
    if not isinstance(trainers, list):
        return []
    lines = []
    for t in trainers:
        try:
            lines.append(_trainer_line(t))
        except (AttributeError, TypeError, ValueError, IndexError):  # a shape not foreseen
            lines.append(Line(f"trainer: unreadable ({_first_line(repr(t))[:80]})", "warn"))
    return lines


def _num(x: object, spec: str) -> str:
    """``x`` formatted by ``spec``; "?" where it is no number (a NaN loss crosses JSON
    as null)."""
    return format(x, spec) if isinstance(x, int | float) and not isinstance(x, bool) else "?"


def _trainer_line(t: dict[str, Any]) -> Line:
    plan = t.get("plan")
    plan = plan if isinstance(plan, dict) else {}
    state = str(t.get("state", "?"))
    text = f"{t.get('name', 'trainer')}  {state}  {plan.get('strategy', '?')}"
    text += f"  step {t.get('steps', 0)}"
    history = t.get("history")
    if isinstance(history, list) and history and len(history[-1]) == 4:
        _, loss, tokens, seconds = history[-1]
        text += f"  loss {_num(loss, '.4g')}"
        if tokens:
            text += f"  {_num(tokens, ',.0f')} tok/s"
        estimated = plan.get("estimated_step_s")
        text += f"  {_num(seconds, '.3g')} s/step" + (
            f" (est {_num(estimated, '.3g')})" if estimated else ""
        )
    recoveries = t.get("recoveries")
    recoveries = recoveries if isinstance(recoveries, list) else []
    if recoveries:
        r = recoveries[-1]
        text += (
            f"  recoveries {len(recoveries)}, last: after step {r.get('step')} lost "
            f"{r.get('lost')} ({_first_line(str(r.get('why', '')))}), {r.get('action')}, "
            f"{_num(r.get('total_s'), '.1f')} s"
        )
    style: Style = "plain"
    if state == "failed":
        style = "failed"
        text += "  " + _first_line(str(t.get("error") or ""))
    elif recoveries:
        style = "warn"
    return Line(text, style)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _actor_line(cols: list[_Col], row: ActorRow, selected: bool) -> Line:
    running = f"{row.endpoint} {row.seconds:.1f}s" if row.endpoint else ""
    if row.health == "failed" and row.failure:
        running = (running + "  " if running else "") + _first_line(row.failure)
    figures = [row.handled, row.errors, row.mailbox, row.in_flight]
    values = [
        row.actor,
        row.mesh,
        str(row.rank),
        row.health,
        *(str(n) if row.answered else "-" for n in figures),
        running,
    ]
    return Line(_cells(cols, values, ">" if selected else " "), _health_style(row.health), selected)


def _header(snap: dict[str, Any] | None, view: View, rows: list[ActorRow]) -> list[Line]:
    ascending = (view.sort == "name") != view.reverse
    order = f"{view.sort} {'ascending' if ascending else 'descending'}"
    if not snap:
        first = f"danaus top  {view.source}  waiting for the controller's first answer"
        return [
            Line(first, "title"),
            Line(""),
            Line(view.status or HELP, "warn" if view.status else "plain"),
        ]
    c = snap.get("controller", {})
    uptime = _duration(float(snap.get("time", 0.0)) - float(c.get("started", 0.0)))
    pms = snap.get("proc_meshes", [])
    procs = [p for pm in pms for p in pm.get("procs", [])]
    failed_procs = sum(p.get("health") == "failed" for p in procs)
    failed_actors = sum(r.health == "failed" for r in rows)
    first = (
        f"danaus top  controller pid {c.get('pid')} on {c.get('host')}  up {uptime}  {view.source}"
    )
    counts = (
        f"proc meshes {len(pms)}  procs {len(procs)} ({failed_procs} failed)  "
        f"actors {len(rows)} ({failed_actors} failed)  failures {len(snap.get('failures', []))}  "
        f"stuck {len(snap.get('stuck', []))}  sort: {order}"
    )
    argv = "argv: " + " ".join(str(a) for a in c.get("argv", []))
    status = Line(view.status, "warn") if view.status else Line(HELP)
    return [Line(first, "title"), Line(argv), Line(counts), status]


# ------------------------------------------------------------------------------- screens


def render(snap: dict[str, Any] | None, view: View, width: int, height: int) -> list[Line]:
    """The screen: at most ``height`` lines of at most ``width`` characters."""
    if width <= 0 or height <= 0:
        return []
    if view.stacks is not None:
        lines = _stack_screen(view, view.stacks, height)
    else:
        lines = _main_screen(snap, view, height)
    return [Line(_fit(_printable(ln.text), width), ln.style, ln.selected) for ln in lines[:height]]


def _main_screen(snap: dict[str, Any] | None, view: View, height: int) -> list[Line]:
    rows = actor_rows(snap)
    lines = [*_header(snap, view, rows), Line("")]
    if not snap:
        return lines
    trainers = _trainer_lines(snap)
    if trainers:  # a few lines at most: the procs and actors below are what one selects
        shown = trainers[:3]
        if len(trainers) > 3:
            shown[-1] = Line(f"  ... {len(trainers) - 2} more trainers")
        lines += [*shown, Line("")]
    room = height - len(lines)
    procs = _proc_lines(snap, view)
    # the procs get up to a third of the room; the actors, whom one selects, the rest
    proc_room = max(1, min(len(procs), (room - 3) // 3))
    if len(procs) > proc_room:
        procs = [*procs[: proc_room - 1], Line(f"  ... {len(procs) - proc_room + 1} more procs")]
    lines.append(Line(_cells(_PROC_COLS, [c.title for c in _PROC_COLS]), "heading"))
    lines.extend(procs)
    lines.append(Line(""))
    ordered = sorted_rows(rows, view)
    cols = _actor_cols(ordered)
    lines.append(Line(_cells(cols, [c.title for c in cols]), "heading"))
    visible = max(1, height - len(lines))
    chosen = selected_index(ordered, view.selected)
    top = 0
    if len(ordered) > visible:  # keep the selection in the middle of the window
        top = max(0, min(chosen - visible // 2, len(ordered) - visible))
    for i in range(top, min(top + visible, len(ordered))):
        lines.append(_actor_line(cols, ordered[i], i == chosen))
    if not ordered:
        lines.append(Line("  (no actors)"))
    return lines


def stack_lines(pane: StackPane) -> list[Line]:
    """The body of the stack screen: the selected actor's threads and tasks first."""
    if pane.error is not None:
        return [Line(f"the controller did not give the stacks: {pane.error}", "failed")]
    if pane.entries is None:
        return [Line(f"asking {pane.procs}[{pane.rank}] for its stacks ...")]
    mine = [e for e in pane.entries if e.get("actor") == pane.actor]
    others = [e for e in pane.entries if e.get("actor") != pane.actor]
    lines: list[Line] = []
    if not mine:
        lines.append(Line(f"{pane.actor} runs no endpoint now; its proc's threads:", "warn"))
    for entry in mine + others:
        kind = f"thread {entry['thread']}" if "thread" in entry else f"task {entry.get('task')}"
        if entry.get("actor"):
            kind += f"  {entry['actor']} {entry.get('endpoint', '?')}"
            kind += f" running {float(entry.get('seconds') or 0.0):.1f}s"
        lines.append(Line(kind, "title" if entry in mine else "heading"))
        lines.extend(Line("  " + ln) for ln in str(entry.get("stack", "")).rstrip().splitlines())
        lines.append(Line(""))
    return lines


def _stack_screen(view: View, pane: StackPane, height: int) -> list[Line]:
    head = [
        Line(f"stacks of {pane.procs}[{pane.rank}], for {pane.actor}  {view.source}", "title"),
        Line(view.status, "warn") if view.status else Line(STACK_HELP),
        Line(""),
    ]
    body = stack_lines(pane)
    room = max(0, height - len(head))
    top = max(0, min(pane.scroll, len(body) - room))
    return head + body[top : top + room]


# ---------------------------------------------------------------------------------- keys


def handle_key(view: View, key: str, rows: list[ActorRow], page: int) -> Action | None:
    """Apply ``key`` (a character, or ``up``, ``down``, ``pgup``, ``pgdn``, ``home``,
    ``end``, ``esc``) to ``view``; what the terminal side must do, if anything.

    ``rows`` are the actors shown (for moving the selection), ``page`` the lines a page
    key moves.
    """
    steps = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -page, "pgdn": page}
    if view.stacks is not None:
        pane = view.stacks
        if key in ("esc", "s", "q"):
            view.stacks = None
        elif key == "r":
            pane.entries, pane.error, pane.scroll = None, None, 0
            return "stacks"
        else:
            last = max(0, len(stack_lines(pane)) - page)
            pane.scroll = {"home": 0, "end": last}.get(key, pane.scroll + steps.get(key, 0))
            pane.scroll = max(0, min(pane.scroll, last))
        return None
    if key == "q":
        return "quit"
    if key in SORT_LETTERS:
        chosen = SORT_LETTERS[key]
        view.reverse = not view.reverse if view.sort == chosen else False
        view.sort = chosen
        return None
    ordered = sorted_rows(rows, view)
    if not ordered:
        return None
    i = selected_index(ordered, view.selected)
    if key in steps or key in ("home", "end"):
        i = {"home": 0, "end": len(ordered) - 1}.get(key, i + steps.get(key, 0))
        view.selected = ordered[max(0, min(i, len(ordered) - 1))].actor
    elif key == "s":
        row = ordered[i]
        view.selected = row.actor
        view.stacks = StackPane(row.actor, row.procs, row.proc_rank)
        return "stacks"
    return None
