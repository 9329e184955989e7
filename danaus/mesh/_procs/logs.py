"""Forwarding procs' output to the controller: ``[trainer 3] loss=0.1``.

Each proc's stdout and stderr (its ``print``s and its ``logging`` records) are pipes read
by the process that spawned it. Lines are printed by the controller with the mesh name
and rank in front. The proc writes unbuffered, and the pipe outlives it, so the last
lines before a crash (even a SIGKILL) still appear. A host agent reads its procs' pipes
and sends the lines to the controller.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .._process import process

__all__ = ["LogOptions"]


@dataclass
class LogOptions:
    """Per proc mesh: whether its procs' output reaches the controller, their log level,
    and whether identical lines from many ranks are printed once.

    Set with ``procs.logging_option(stream_to_client=..., level=..., aggregate_window_sec=...)``.
    """

    stream_to_client: bool = True
    level: int = logging.WARNING
    #: ``None``: print each line as it comes; else collect lines for this many seconds
    #: and print identical ones (same stream, same text) once, naming their ranks.
    aggregate_window_sec: float | None = None
    aggregator: Aggregator | None = field(default=None, repr=False, compare=False)


LineSink = Callable[[str, str], None]  # (stream "out" | "err", line without newline)


def _write(stream: str, text: str) -> None:
    out = sys.stdout if stream == "out" else sys.stderr
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass  # our own stdout is gone: nothing to print to


def printer(name: str, rank: int, options: LogOptions) -> LineSink:
    """Print each line on the controller's own stdout/stderr, prefixed ``[name rank]``;
    with ``aggregate_window_sec`` set, through the mesh's :class:`Aggregator`."""

    def sink(stream: str, line: str) -> None:
        if not options.stream_to_client:
            return
        if options.aggregate_window_sec is not None:
            agg = options.aggregator
            if agg is None:
                agg = options.aggregator = Aggregator(name)
            agg.add(stream, rank, line, options.aggregate_window_sec)
            return
        _write(stream, f"[{name} {rank}] {line}\n")

    return sink


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    out: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


class Aggregator:
    """Identical lines of one mesh's ranks within a window, printed once:
    ``[trainer 0-7] loss=0.1`` for a line that all eight ranks printed.

    A window opens with the first line and closes ``aggregate_window_sec`` later; lines
    are then printed in the order they first came. What is pending when the mesh stops,
    or at interpreter exit, is printed then.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], list[int]] = {}
        self._timer: asyncio.TimerHandle | None = None
        process.aggregators.add(self)

    def __repr__(self) -> str:
        return f"<Aggregator {self.name} pending={len(self._pending)}>"

    def add(self, stream: str, rank: int, line: str, window: float) -> None:
        with self._lock:
            self._pending.setdefault((stream, line), []).append(rank)
            if self._timer is not None:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop to time the window: print now
                loop = None
            if loop is not None:
                self._timer = loop.call_later(window, self.flush)
        if loop is None:
            self.flush()

    def flush(self) -> None:
        """Print what is pending, one line per distinct (stream, text)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for (stream, line), ranks in pending.items():
            _write(stream, f"[{self.name} {rank_ranges(ranks)}] {line}\n")


@atexit.register
def _flush_all() -> None:
    for agg in list(process.aggregators):
        agg.flush()


class LineReader(asyncio.Protocol):
    """Reads a pipe and hands complete lines to a sink (the last partial one at EOF)."""

    def __init__(self, stream: str, sink: LineSink) -> None:
        self.stream = stream
        self.sink = sink
        self.partial = b""

    def data_received(self, data: bytes) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self.sink(self.stream, line.decode(errors="replace"))

    def eof_received(self) -> bool | None:
        if self.partial:
            self.sink(self.stream, self.partial.decode(errors="replace"))
            self.partial = b""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof_received()
