"""The shapes of what procs say about themselves: the records behind ``mesh.stats()`` and
``mesh.stacks()``, as every proc's control actor (``ProcControl``) answers them.

They are plain dicts at run time (JSON-able, what tools show); these ``TypedDict``\\ s say
which keys they hold. The records a proc makes (``ActorRecord``, ``ProcRecord``,
``StackEntry``) are the actor layer's, re-exported here; pairs in ``running`` are tuples
where made and lists once they crossed the wire.
"""

from __future__ import annotations

from typing import Literal, TypedDict, cast

from ..._records import ActorRecord, ProcFields, ProcRecord, StackEntry
from ...errors import ProtocolError

__all__ = [
    "ActorRecord",
    "ActorStats",
    "GoneActorStats",
    "ProcRecord",
    "ProcReply",
    "ProcStats",
    "StackEntry",
    "proc_reply",
    "stack_entries",
]


class ProcReply(TypedDict):
    """A proc's answer to ``stats``: its record and those of the actors asked about, by
    wire key."""

    proc: ProcRecord
    actors: dict[str, ActorRecord]


class ActorStats(ActorRecord):
    """``mesh.stats()`` of a live actor: its record and its proc's."""

    proc: ProcRecord


class GoneActorStats(TypedDict):
    """``mesh.stats()`` of an actor its proc no longer holds."""

    actor: None
    gone: Literal[True]
    proc: ProcRecord


class ProcStats(ProcFields):
    """``procs.stats()`` of one proc: its record, with the records of its actors."""

    actors: list[ActorRecord]


def proc_reply(obj: object, addr: str) -> ProcReply:
    """``obj``, a proc's answer to ``stats``, checked for its shape.

    Raises:
        ProtocolError: the proc at ``addr`` answered something else.
    """
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("proc"), dict)
        and isinstance(obj.get("actors"), dict)
    ):
        raise ProtocolError(f"proc {addr} answered stats with {type(obj).__name__}, not a record")
    return cast(ProcReply, obj)


def stack_entries(obj: object, addr: str) -> list[StackEntry]:
    """``obj``, a proc's answer to ``stacks``, checked for its shape.

    Raises:
        ProtocolError: the proc at ``addr`` answered something else.
    """
    if not (isinstance(obj, list) and all(isinstance(e, dict) and "stack" in e for e in obj)):
        raise ProtocolError(f"proc {addr} answered stacks with {type(obj).__name__}, not stacks")
    return cast(list[StackEntry], obj)
