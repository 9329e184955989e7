"""The commands of ``danaus debug``, as values: :func:`parse_command` turns a typed line into
one, :func:`select` finds the sessions a cast reaches. No I/O here.

The commands are Monarch's debugger's (``list``, ``attach``, ``cast``, ``continue``,
``help``, ``quit``), and a cast may also name its ranks as ``mesh[0,1]`` or every paused
actor as ``*``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeAlias

__all__ = [
    "Attach",
    "Cast",
    "Command",
    "CommandError",
    "Continue",
    "Empty",
    "Help",
    "ListSessions",
    "Quit",
    "Ranks",
    "matches",
    "parse_command",
    "parse_ranks",
    "select",
]

#: Ranks of one dim: one, several, or a range (``stop`` may be open: ``sys.maxsize``).
DimRanks: TypeAlias = int | tuple[int, ...] | range
#: Which ranks a cast reaches: None (all of them), linear ranks, or coordinates by dim.
Ranks: TypeAlias = tuple[int, ...] | range | dict[str, DimRanks] | None


class CommandError(ValueError):
    """A typed line is no command (the user's to fix; the message says how)."""


class ListSessions(NamedTuple):
    """``list``: the paused actors."""


class Attach(NamedTuple):
    """``attach <mesh> <rank>``: type into that actor's pdb until ``detach``."""

    mesh: str
    rank: int


class Cast(NamedTuple):
    """``cast <mesh> ranks(...) <cmd>`` / ``cast <mesh>[...] <cmd>`` / ``cast <mesh> <cmd>``
    / ``cast * <cmd>``: one pdb command to several actors. ``mesh`` None: every one."""

    mesh: str | None
    ranks: Ranks
    command: str


class Continue(NamedTuple):
    """``continue``: every paused actor clears its breakpoints and goes on."""


class Help(NamedTuple):
    """``help``."""


class Quit(NamedTuple):
    """``quit``: leave; the actors stay paused for the next attach."""


class Empty(NamedTuple):
    """A blank line."""


Command: TypeAlias = ListSessions | Attach | Cast | Continue | Help | Quit | Empty

_NAME = r"[A-Za-z0-9_.\-]+"
_CAST = re.compile(
    rf"^(?P<mesh>\*|{_NAME})\s*(?:\[(?P<br>[^\]]*)\]|\s+ranks\((?P<rk>[^)]*(?:\([^)]*\)[^)]*)*)\))?"
    r"\s+(?P<cmd>\S.*)$"
)
_INT = re.compile(r"^-?\d+$")
_DIM = re.compile(rf"^\s*({_NAME})\s*=\s*(.+?)\s*$")


def parse_command(line: str) -> Command:
    """The command a typed line says. Raises :class:`CommandError` saying what is wrong."""
    text = line.strip()
    if not text:
        return Empty()
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in ("l", "list") and not rest:
        return ListSessions()
    if word in ("h", "help", "?") and not rest:
        return Help()
    if word in ("q", "quit", "exit") and not rest:
        return Quit()
    if word in ("c", "continue") and not rest:
        return Continue()
    if word in ("a", "attach"):
        return _attach(rest)
    if word == "cast":
        return _cast(rest)
    raise CommandError(f"unknown command {text!r}: type 'help' for the commands")


def _attach(rest: str) -> Attach:
    m = re.match(rf"^({_NAME})\s*(?:\[\s*(-?\d+)\s*\]|\s+(-?\d+))$", rest)
    if m is None:
        raise CommandError("attach takes a mesh and a rank: 'attach <mesh> <rank>'")
    return Attach(m.group(1), int(m.group(2) if m.group(2) is not None else m.group(3)))


def _cast(rest: str) -> Cast:
    m = _CAST.match(rest)
    if m is None:
        raise CommandError(
            "cast takes a target and a pdb command: 'cast <mesh> ranks(0,1) n', "
            "'cast <mesh>[0,1] n', 'cast <mesh> n' or 'cast * n'"
        )
    mesh = m.group("mesh")
    spec = m.group("br") if m.group("br") is not None else m.group("rk")
    if mesh == "*":
        if spec is not None:
            raise CommandError("'cast *' reaches every paused actor: it takes no ranks")
        return Cast(None, None, m.group("cmd"))
    return Cast(mesh, None if spec is None else parse_ranks(spec), m.group("cmd"))


def parse_ranks(spec: str) -> Ranks:
    """``3``, ``0,1,3``, ``start:stop[:step]`` (either end may be left out), or
    ``dim=..., dim=...`` with each dim's ranks an int, a range, or ``(a,b,...)``."""
    spec = spec.strip()
    if not spec:
        raise CommandError("empty ranks: give a rank, a list, a range or dims")
    if "=" in spec:
        dims: dict[str, DimRanks] = {}
        for part in _split_top(spec):
            m = _DIM.match(part)
            if m is None:
                raise CommandError(f"{part!r} is not 'dim=ranks'")
            name, value = m.group(1), m.group(2)
            if name in dims:
                raise CommandError(f"dim {name!r} given twice")
            if value.startswith("(") and value.endswith(")"):
                dims[name] = _ints(value[1:-1])
            else:
                dims[name] = _range_or_int(value)
        return dims
    if ":" in spec:
        return _range(spec)
    return _ints(spec)


def _split_top(spec: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    parts.append(spec[start:])
    return parts


def _ints(text: str) -> tuple[int, ...]:
    items = [t.strip() for t in text.split(",")]
    if not items or not all(_INT.match(t) for t in items):
        raise CommandError(f"{text!r} is not a rank or a list of ranks")
    return tuple(int(t) for t in items)


def _range_or_int(text: str) -> DimRanks:
    if ":" in text:
        return _range(text)
    if _INT.match(text.strip()):
        return int(text)
    raise CommandError(f"{text!r} is not a rank, a range or (a,b,...)")


def _range(text: str) -> range:
    bits = [b.strip() for b in text.split(":")]
    if len(bits) > 3 or not all(b == "" or _INT.match(b) for b in bits):
        raise CommandError(f"{text!r} is not a range: use start:stop or start:stop:step")
    start = int(bits[0]) if bits[0] else 0
    stop = int(bits[1]) if bits[1] else sys.maxsize
    step = int(bits[2]) if len(bits) == 3 and bits[2] else 1
    if step == 0:
        raise CommandError(f"{text!r}: a range's step cannot be 0")
    return range(start, stop, step)


def matches(ranks: Ranks, rank: int, coords: Mapping[str, int]) -> bool:
    """Is the actor of linear ``rank`` (at ``coords``) among ``ranks``?"""
    if ranks is None:
        return True
    if isinstance(ranks, dict):
        for dim, want in ranks.items():
            if dim not in coords:
                return False
            at = coords[dim]
            if at not in (want if isinstance(want, (tuple, range)) else (want,)):
                return False
        return True
    return rank in ranks


def select(sessions: Iterable[Mapping[str, Any]], cast: Cast) -> list[int]:
    """The ids of the sessions (records of ``debug.list``) that ``cast`` reaches."""
    return [
        int(s["id"])
        for s in sessions
        if (cast.mesh is None or s["mesh"] == cast.mesh)
        and matches(cast.ranks, int(s["rank"]), s.get("coords") or {})
    ]
