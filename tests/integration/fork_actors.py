"""Actors for the fork-server tests (importable by procs). This module imports neither
numpy nor torch: what a proc has of them, it inherited."""

from __future__ import annotations

import os
import random
import sys
import threading
from typing import Any

from danaus import Actor, endpoint


class Probe(Actor):
    """Reports what its process inherited and how it behaves."""

    @endpoint
    def where(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()

    @endpoint
    def environ(self, name: str) -> str:
        return os.environ.get(name, "")

    @endpoint
    def nested_environ(self, name: str) -> str:
        """``name`` in the environment of a proc this proc spawns on its this_host()."""
        from danaus import this_host

        procs = this_host().spawn_procs(per_host={"procs": 1}, name="nested")
        try:
            return procs.spawn("inner", Probe).environ.call_one(name).get(timeout=60)
        finally:
            procs.stop().get(timeout=60)

    @endpoint
    def settings(self, names: list[str]) -> dict[str, Any]:
        """These fields of the proc's ``danaus.config``, and its root logger's level."""
        import logging

        from danaus.config import config

        got = {name: getattr(config, name) for name in names}
        got["root logger"] = logging.getLevelName(logging.getLogger().level)
        return got

    @endpoint
    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def imported(self, name: str) -> bool:
        return name in sys.modules

    @endpoint
    def modules(self) -> list[str]:
        return sorted(m for m in ("numpy", "torch") if m in sys.modules)

    @endpoint
    def draws(self) -> tuple[float, float, float]:
        import numpy
        import torch

        return random.random(), float(numpy.random.rand()), float(torch.rand(1).item())

    @endpoint
    def socket_inodes(self) -> set[str]:
        return _socket_inodes(os.getpid())

    @endpoint
    def threads(self) -> dict[str, Any]:
        import torch

        a = torch.randn(256, 256)
        total = float((a @ a).sum())  # the intra-op pool works after fork
        return {
            "torch_threads": torch.get_num_threads(),
            "matmul": total == total,
            "python_threads": threading.active_count(),
        }


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


class CudaProbe(Actor):
    @endpoint
    def cuda_sum(self) -> float:
        import torch

        return float(torch.ones(4, device="cuda").sum().item())
