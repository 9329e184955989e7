"""The RDMA microbenchmark CLI runs end to end and reports every available backend."""

from __future__ import annotations

import json
import subprocess
import sys


def test_rdma_bench_json_reports_each_backend_and_floors() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "danaus",
            "rdma-bench",
            "--sizes",
            "4096,65536",
            "--op",
            "read",
            "--backend",
            "shm",
            "--backend",
            "tcp",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = json.loads(out.stdout)
    assert {(r["backend"], r["size"]) for r in rows} == {
        ("shm", 4096),
        ("shm", 65536),
        ("tcp", 4096),
        ("tcp", 65536),
    }
    for r in rows:
        assert r["op"] == "read" and r["GB/s"] > 0 and r["p99_us"] >= r["median_us"] > 0
        assert r["memcpy_GB/s"] > 0 and r["raw_tcp_GB/s"] > 0
