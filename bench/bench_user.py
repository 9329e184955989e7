"""Issue 29's figures in a user's setting, each against its target and a floor measured in
the same run: the actor class in the program's ``__main__`` (which imports numpy), a sync
``def f(self, x): return x`` endpoint and its ``async`` twin. The other runtime rows of
``make bench`` use actors in light modules; these are what a user's program sees.
``python -m bench.bench_user``.

The program runs twice: unpinned (where the scheduler puts its processes, as a user's
would be), then with every process of it, the floors' included, on one CPU. On these
2-vCPU machines the first is dominated by placement (waking a process on the other,
idle vCPU costs tens of µs, and where two processes land changes from run to run, the
raw floor's included); the second compares danaus and the floor in the same placement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ._stats import format_table

ROOT = Path(__file__).resolve().parent.parent


def measure(cpu: int | None = None) -> dict[str, float]:
    """Run the user's program (``bench/_user_program.py``) as a script: its figures.
    ``cpu``: pin it (and so every process it starts) to that one CPU."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_user_program.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}),
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    print("unpinned:")
    table(measure())
    cpu = min(os.sched_getaffinity(0))
    print(f"\nevery process on CPU {cpu}:")
    table(measure(cpu))
    print(
        "\nfloors, each run: a raw uvloop ping-pong over a Unix socket between two "
        "processes, and a raw uvloop pipelined echo (1,000 in flight)"
    )


def table(got: dict[str, float]) -> None:
    """Print one run's figures against their floors and targets."""
    floor, pipelined = got["floor_pingpong_us"], got["floor_pipelined_per_s"]
    cols = ["figure", "danaus", "floor", "ratio", "target"]

    def rtt(figure: str, key: str, target: float) -> dict[str, object]:
        return {
            "figure": figure,
            "danaus": f"{got[key]:.1f} us",
            "floor": f"{floor:.1f} us",
            "ratio": round(got[key] / floor, 2),
            "target": f"<= {target}x",
        }

    rows: list[dict[str, object]] = [
        rtt("call_one 16 B, sync endpoint, .get() from a plain thread", "sync_get", 2.0),
        rtt("call_one, sync endpoint, await", "await_sync", 1.6),
        rtt("call_one, async endpoint, await", "await_async", 1.3),
        {
            "figure": "1,000 call_one in flight, sync endpoint, calls/s",
            "danaus": f"{got['in_flight']:,.0f}",
            "floor": f"{pipelined:,.0f}",
            "ratio": round(got["in_flight"] / pipelined, 2),
            "target": ">= 0.6x",
        },
        {
            "figure": "call() on 8 actors (8 procs), await",
            "danaus": f"{got['call_8']:.0f} us",
            "floor": "",
            "ratio": "",
            "target": "<= 250 us",
        },
    ]
    print(format_table(rows, cols))


if __name__ == "__main__":
    main()
