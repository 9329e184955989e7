"""Forwarding procs' output to the controller: ``[trainer 3] loss=0.1``.

Each proc's stdout and stderr (its ``print``s and its ``logging`` records) are pipes read
by the process that spawned it. Lines are printed by the controller with the mesh name
and rank in front. The proc writes unbuffered, and the pipe outlives it, so the last
lines before a crash (even a SIGKILL) still appear. A host agent reads its procs' pipes
and sends the lines to the controller.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LogOptions"]


@dataclass
class LogOptions:
    """Per proc mesh: whether its procs' output reaches the controller, and their log level.

    Set with ``procs.logging_option(stream_to_client=..., level=...)``.
    """

    stream_to_client: bool = True
    level: int = logging.WARNING


LineSink = Callable[[str, str], None]  # (stream "out" | "err", line without newline)


def printer(prefix: str, options: LogOptions) -> LineSink:
    """Print each line on the controller's own stdout/stderr, prefixed ``[prefix]``."""

    def sink(stream: str, line: str) -> None:
        if options.stream_to_client:
            out = sys.stdout if stream == "out" else sys.stderr
            try:
                out.write(f"[{prefix}] {line}\n")
                out.flush()
            except (OSError, ValueError):
                pass  # our own stdout is gone: nothing to print to

    return sink


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
