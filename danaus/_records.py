"""What a proc and its actors say of themselves (``mesh.stats()``, ``mesh.stacks()``, the
admin endpoint's snapshot, ``danaus top``): the records' fields, which the actor layer
fills in and the mesh layer gathers, shows and sends on. Plain dicts at run time
(JSON-able).
"""

from __future__ import annotations

from typing import NotRequired, Required, TypedDict

__all__ = ["ActorRecord", "ProcFields", "ProcRecord", "StackEntry"]


class ActorRecord(TypedDict):
    """One actor: its counters, mailbox depth and the endpoints running now.

    Plain dicts at run time (JSON-able); pairs in ``running`` are tuples where made and
    lists once they crossed the wire.
    """

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
    #: of those endpoints, the ones that run as long as what they serve
    #: (``@endpoint(long_running=True)``): never stuck
    long_running: NotRequired[list[str]]
    failed: str | None
    stopped: bool


class ProcFields(TypedDict):
    """What every record of a proc holds, whatever else it holds."""

    pid: int
    host: str
    addr: str
    cpu_percent: float
    rss_bytes: int
    connections: int
    bytes_in: int
    bytes_out: int
    threads: int


class ProcRecord(ProcFields):
    """One proc: pid, host, CPU % since its last record, RSS, connections, bytes."""

    #: how many actors it holds
    actors: int


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
