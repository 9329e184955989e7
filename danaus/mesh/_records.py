"""The shapes of what procs say about themselves: the records behind ``mesh.stats()`` and
``mesh.stacks()``, as every proc's control actor (``ProcControl``) answers them.

They are plain dicts at run time (JSON-able, what tools show); these ``TypedDict``\\ s say
which keys they hold. Pairs in ``running`` are tuples where made and lists once they
crossed the wire.
"""

from __future__ import annotations

from typing import Literal, Required, TypedDict, cast

from ..errors import ProtocolError

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


class ActorRecord(TypedDict):
    """One actor: its counters, mailbox depth and the endpoints running now."""

    actor: str
    mesh: str
    rank: int
    #: messages handled / failed, per endpoint
    handled: dict[str, int]
    errors: dict[str, int]
    last_failure: str | None
    mailbox: int
    in_flight: int
    #: (endpoint, seconds it has run) of each message running now
    running: list[tuple[str, float]]
    failed: str | None
    stopped: bool


class _ProcFields(TypedDict):
    pid: int
    host: str
    addr: str
    cpu_percent: float
    rss_bytes: int
    connections: int
    bytes_in: int
    bytes_out: int
    threads: int


class ProcRecord(_ProcFields):
    """One proc: pid, host, CPU % since its last record, RSS, connections, bytes."""

    #: how many actors it holds
    actors: int


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


class ProcStats(_ProcFields):
    """``procs.stats()`` of one proc: its record, with the records of its actors."""

    actors: list[ActorRecord]


class StackEntry(TypedDict, total=False):
    """One stack of ``mesh.stacks()``: a thread's (``thread``) or a running async
    endpoint's (``task``); one running an endpoint names the actor, the endpoint and
    for how long (``seconds``)."""

    thread: str
    task: str
    actor: str
    endpoint: str
    seconds: float
    stack: Required[str]


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
