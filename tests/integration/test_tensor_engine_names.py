"""Monarch's function forms of the tensor engine (``reduce``, ``reduce_``, ``to_mesh``,
``Tensor``), its ``monarch.timer`` and ``monarch.builtins``, as danaus serves them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from danaus import this_host
from danaus.tensor_engine import DTensor, Tensor, inspect, reduce, reduce_, remote, to_mesh
from danaus.tensor_engine.builtins import log_remote, set_logging_level_remote
from danaus.tensor_engine.timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_latest_timer_measurement,
)


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2}, name="names")
    yield mesh
    mesh.stop().get(timeout=60)


def test_reduce_and_to_mesh_take_pytrees(procs: Any) -> None:
    assert Tensor is DTensor
    with procs.activate():
        x = torch.arange(3.0) + torch.tensor(1.0)
        summed = reduce({"a": [x, x * 2]}, "gpus")
        assert set(summed) == {"a"} and len(summed["a"]) == 2
        y = x.clone()
        assert reduce_((y,), "gpus", "max")[0] is y  # in place
        moved = to_mesh([x], procs)
        with pytest.raises(ValueError, match="leave stream out"):
            to_mesh(x, procs, stream=object())  # type: ignore[arg-type]
    assert torch.equal(inspect(summed["a"][0], gpus=1), torch.tensor([2.0, 4.0, 6.0]))
    assert torch.equal(inspect(summed["a"][1], gpus=0), torch.tensor([4.0, 8.0, 12.0]))
    assert torch.equal(inspect(y, gpus=0), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(inspect(moved[0], gpus=1), torch.tensor([1.0, 2.0, 3.0]))


class _Kept(logging.Handler):
    """On a proc: keeps the messages of danaus.builtins' records."""

    messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@remote(propagate=lambda: torch.zeros(2))
def _builtins_seen() -> torch.Tensor:
    """On a proc: [the builtins logger's level, how many "step 7" messages it kept]."""
    logger = logging.getLogger("danaus.builtins")
    if not any(isinstance(h, _Kept) for h in logger.handlers):
        logger.addHandler(_Kept())
    seen = sum("step 7 of" in m for m in _Kept.messages)
    return torch.tensor([float(logger.level), float(seen)])


def test_builtins_log_on_every_proc(procs: Any) -> None:
    with procs.activate():
        _builtins_seen()  # (its handler in place first)
        set_logging_level_remote(logging.INFO)
        log_remote("step %d of \udcff", 7, level=logging.INFO)
        log_remote("step %d of nothing", 7, level=logging.DEBUG)  # below the level
        seen = _builtins_seen()
    for rank in (0, 1):
        assert inspect(seen, gpus=rank).tolist() == [float(logging.INFO), 1.0]


def test_the_timer_times_named_sections_on_the_cpu() -> None:
    ExecutionTimer.reset()
    execution_timer_start("outer", use_cpu=True)
    with ExecutionTimer.time("inner", use_cpu=True):
        sum(range(10_000))
    execution_timer_stop("outer", use_cpu=True)
    summary = ExecutionTimer.summary()
    assert summary["outer"]["count"] == 1 and summary["inner"]["count"] == 1
    assert summary["outer"]["total_ms"] >= summary["inner"]["total_ms"] > 0
    assert get_latest_timer_measurement("inner").item() == summary["inner"]["max_ms"]
    assert get_execution_timer_average_ms("outer").dtype == torch.float64
    with pytest.raises(RuntimeError, match="no such section open"):
        execution_timer_stop("never", use_cpu=True)
    with pytest.raises(KeyError, match="'nothing'"):
        get_execution_timer_average_ms("nothing")
