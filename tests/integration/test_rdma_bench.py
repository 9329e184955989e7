"""The RDMA microbenchmark CLI runs end to end and reports every available backend."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ..hardware import need_rdma_device
from ..timing import within


def _bench(*backends: str, op: str = "read") -> list[dict[str, Any]]:
    args = [sys.executable, "-m", "danaus", "rdma-bench", "--sizes", "4096,65536", "--op", op]
    for b in backends:
        args += ["--backend", b]
    out = subprocess.run(
        [*args, "--json"], capture_output=True, text=True, timeout=within(120), check=True
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def _check(rows: list[dict[str, Any]], backends: set[str], op: str) -> None:
    assert {(r["backend"], r["size"]) for r in rows} == {
        (b, size) for b in backends for size in (4096, 65536)
    }
    for r in rows:
        assert r["op"] == op and r["GB/s"] > 0 and r["p99_us"] >= r["median_us"] > 0
        assert r["memcpy_GB/s"] > 0 and r["raw_tcp_GB/s"] > 0


def test_rdma_bench_json_reports_each_backend_and_floors() -> None:
    _check(_bench("shm", "tcp"), {"shm", "tcp"}, "read")


def test_rdma_bench_on_a_real_verbs_device() -> None:
    need_rdma_device()
    for op in ("read", "write"):
        _check(_bench("ibverbs", op=op), {"ibverbs"}, op)
