"""What ``danaus top`` shows, before it is drawn: the actors table's rows built from a
snapshot (the admin endpoint's ``snapshot`` op, plain JSON), their sort orders, and the
:class:`View` that the keys change (selection, sort, the stack pane).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

__all__ = [
    "SORT_LETTERS",
    "Action",
    "ActorRow",
    "SortKey",
    "StackPane",
    "View",
    "actor_rows",
    "selected_index",
    "sorted_rows",
]

SortKey = Literal["name", "mailbox", "cpu", "handled", "errors", "running"]

#: the sort orders by the key that picks them (pressing it again reverses the order)
SORT_LETTERS: dict[str, SortKey] = {
    "n": "name",
    "m": "mailbox",
    "c": "cpu",
    "h": "handled",
    "e": "errors",
    "r": "running",
}

#: what :func:`handle_key` asks of the terminal side
Action = Literal["quit", "stacks"]


@dataclass
class StackPane:
    """The stack screen of one actor: its proc's threads and tasks, the actor's first.

    ``entries`` is None until the controller answered, ``error`` says why it did not.
    """

    actor: str
    procs: str
    rank: int
    entries: list[dict[str, Any]] | None = None
    error: str | None = None
    scroll: int = 0


@dataclass
class View:
    """What the person looking chose, and the line of news from the controller.

    ``selected`` is an actor id, so the selection follows its actor when the order
    changes; None selects the top row.
    """

    source: str = ""
    sort: SortKey = "name"
    reverse: bool = False
    selected: str | None = None
    status: str = ""
    stacks: StackPane | None = None


class ActorRow(NamedTuple):
    """One row of the actors table."""

    actor: str
    mesh: str
    rank: int
    health: str
    handled: int
    errors: int
    mailbox: int
    in_flight: int
    endpoint: str  # the longest running one, "" when none runs
    seconds: float
    cpu: float  # its proc's
    procs: str
    proc_rank: int
    failure: str | None
    answered: bool = True  # False: its proc is gone, its figures with it


# ---------------------------------------------------------------------------------- rows


def _natural(s: str) -> list[Any]:
    """``procs[2]`` before ``procs[10]``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def actor_rows(snap: dict[str, Any] | None) -> list[ActorRow]:
    """The actors of a snapshot; the actors of a failed proc (which cannot answer for
    themselves) come from their meshes' failed ranks."""
    if not snap:
        return []
    cpu: dict[tuple[str, int], float] = {}
    for pm in snap.get("proc_meshes", []):
        for p in pm.get("procs", []):
            cpu[pm["name"], p["rank"]] = float(p.get("cpu_percent") or 0.0)
    rows, seen = [], set()
    for a in snap.get("actors", []):
        running = max(a.get("running") or [], key=lambda r: r[1], default=("", 0.0))
        rows.append(
            ActorRow(
                actor=a["actor"],
                mesh=a["mesh"],
                rank=a["rank"],
                health=a.get("health", "?"),
                handled=sum(a.get("handled", {}).values()),
                errors=sum(a.get("errors", {}).values()),
                mailbox=a.get("mailbox", 0),
                in_flight=a.get("in_flight", 0),
                endpoint=running[0],
                seconds=float(running[1]),
                cpu=cpu.get((a["procs"], a["proc_rank"]), 0.0),
                procs=a["procs"],
                proc_rank=a["proc_rank"],
                failure=a.get("last_failure"),
            )
        )
        seen.add((a["procs"], a["mesh"], a["rank"]))
    for pm in snap.get("proc_meshes", []):
        for m in pm.get("actor_meshes", []):
            if m.get("stopped"):
                continue
            for r, why in m.get("failed", {}).items():
                if (pm["name"], m["name"], int(r)) not in seen:
                    rows.append(_lost_actor(pm["name"], m["name"], int(r), why))
    return rows


def _lost_actor(procs: str, mesh: str, rank: int, why: str) -> ActorRow:
    # an actor's rank is its proc's rank, and its id is "<procs>[r].<mesh>[r]"
    return ActorRow(
        actor=f"{procs}[{rank}].{mesh}[{rank}]",
        mesh=mesh,
        rank=rank,
        health="failed",
        handled=0,
        errors=0,
        mailbox=0,
        in_flight=0,
        endpoint="",
        seconds=0.0,
        cpu=0.0,
        procs=procs,
        proc_rank=rank,
        failure=why,
        answered=False,
    )


def _sort_value(row: ActorRow, key: SortKey) -> Any:
    if key == "name":
        return _natural(row.actor)
    return {
        "mailbox": row.mailbox,
        "cpu": row.cpu,
        "handled": row.handled,
        "errors": row.errors,
        "running": row.seconds,
    }[key]


def sorted_rows(rows: list[ActorRow], view: View) -> list[ActorRow]:
    """``rows`` in the view's order: names ascending, figures largest first; reversed
    when asked; ties by name."""
    by_name = sorted(rows, key=lambda r: _natural(r.actor))
    if view.sort == "name":
        return by_name[::-1] if view.reverse else by_name
    descending = not view.reverse
    return sorted(by_name, key=lambda r: _sort_value(r, view.sort), reverse=descending)


def selected_index(ordered: list[ActorRow], selected: str | None) -> int:
    for i, row in enumerate(ordered):
        if row.actor == selected:
            return i
    return 0
