"""Execution timing of named sections, on the GPU where there is one (CUDA events on the
current stream) and on the CPU otherwise, as Monarch's ``monarch.timer``. In a mesh, the
functions run on every proc through ``remote``::

    start = remote("danaus.tensor_engine.timer.execution_timer_start", propagate=lambda n=None: None)

A CUDA section's time is read when asked for (``summary``, ``get_latest_measurement``),
waiting then for its end event: nothing polls in the background.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
]

log = logging.getLogger("danaus.timer")


class ExecutionTimer:
    """Named sections timed in milliseconds, process-wide (class methods, as Monarch's)."""

    _lock = threading.Lock()
    #: name -> finished times (ms)
    _times: dict[str, list[float]] = {}
    #: name -> CPU start times of open sections (a stack: sections of one name may nest)
    _cpu_open: dict[str, list[float]] = {}
    #: name -> (start, end) CUDA events of open sections
    _cuda_open: dict[str, list[tuple[Any, Any]]] = {}
    #: name -> (start, end) CUDA events of sections stopped but not yet read
    _cuda_done: dict[str, list[tuple[Any, Any]]] = {}

    @staticmethod
    def _cuda() -> bool:
        import torch

        return bool(torch.cuda.is_available())

    @classmethod
    @contextmanager
    def time(cls, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        """``with ExecutionTimer.time("step"): ...`` times the block."""
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Open section ``name`` ("default"): on the GPU's current stream where there is a
        GPU and ``use_cpu`` is false, else on the CPU clock."""
        name = name or "default"
        with cls._lock:
            cls._times.setdefault(name, [])
            if use_cpu or not cls._cuda():
                cls._cpu_open.setdefault(name, []).append(time.perf_counter())
                return
        import torch

        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        begin.record(torch.cuda.current_stream())
        with cls._lock:
            cls._cuda_open.setdefault(name, []).append((begin, end))

    @classmethod
    def stop(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Close the newest open section ``name``.

        Raises:
            RuntimeError: no section of that name is open (on that clock).
        """
        name = name or "default"
        now = time.perf_counter()
        with cls._lock:
            if use_cpu or not cls._cuda():
                started = cls._cpu_open.get(name)
                if not started:
                    raise RuntimeError(f"ExecutionTimer.stop({name!r}): no such section open")
                cls._times[name].append((now - started.pop()) * 1000.0)
                return
            events = cls._cuda_open.get(name)
            if not events:
                raise RuntimeError(f"ExecutionTimer.stop({name!r}): no such section open")
            begin, end = events.pop()
        import torch

        end.record(torch.cuda.current_stream())
        with cls._lock:
            cls._cuda_done.setdefault(name, []).append((begin, end))

    @classmethod
    def _settle(cls, name: str | None = None) -> None:
        """Read the times of stopped CUDA sections (waiting for their end events)."""
        with cls._lock:
            names = [name] if name is not None else list(cls._cuda_done)
            pending = [(n, cls._cuda_done.pop(n, [])) for n in names]
        for n, events in pending:
            for begin, end in events:
                end.synchronize()
                with cls._lock:
                    cls._times.setdefault(n, []).append(float(begin.elapsed_time(end)))

    @classmethod
    def reset(cls) -> None:
        """Forget every time (open sections stay open)."""
        with cls._lock:
            cls._times = {}
            cls._cuda_done = {}

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        """Per section: ``count``, ``mean_ms``, ``total_ms``, ``min_ms``, ``max_ms``."""
        cls._settle()
        with cls._lock:
            return {
                name: {
                    "count": len(times),
                    "mean_ms": sum(times) / len(times),
                    "total_ms": sum(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
                for name, times in cls._times.items()
                if times
            }

    @classmethod
    def get_latest_measurement(cls, name: str | None = None) -> float:
        """The newest time of section ``name`` (ms); 0.0, with a warning, if none."""
        name = name or "default"
        cls._settle(name)
        with cls._lock:
            times = cls._times.get(name)
            if not times:
                log.warning("ExecutionTimer: no time of section %r yet", name)
                return 0.0
            return times[-1]


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    """:meth:`ExecutionTimer.start`, as a function ``remote`` can name."""
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    """:meth:`ExecutionTimer.stop`, as a function ``remote`` can name."""
    ExecutionTimer.stop(name, use_cpu)


def get_execution_timer_average_ms(name: str = "default") -> torch.Tensor:
    """The mean time of section ``name`` (ms), as a float64 tensor (to fetch from a mesh).

    Raises:
        KeyError: no time of that section yet.
    """
    import torch

    summary = ExecutionTimer.summary()
    if name not in summary:
        raise KeyError(f"ExecutionTimer: no time of section {name!r} yet")
    return torch.tensor(summary[name]["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> torch.Tensor:
    """:meth:`ExecutionTimer.get_latest_measurement` as a float64 tensor."""
    import torch

    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    """:meth:`ExecutionTimer.summary`."""
    return ExecutionTimer.summary()
