"""What ``attach`` costs a call: ``call_one`` round trip to a sync endpoint and
1,000-in-flight throughput from a controller attached through a host agent's gateway
(every byte relayed as actor messages by the agent, both ways) against the same
controller program reaching the agent's proc directly (the floor), in the same run.

``attach`` must come first in a process, so each side is a controller program of its
own (``python -m bench.bench_attach --side attached|direct AGENT``), run alternately
against one host agent on a TCP port of this machine; each prints its figures as JSON.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ._stats import format_table

ROUNDS = 5
ROOT = Path(__file__).resolve().parents[1]


def _side(side: str, agent: str) -> None:
    import uvloop

    from danaus import attach, attach_to_workers

    from .bench_runtime import Echo, _latency, _throughput

    if side == "attached":
        attach(agent)

    async def measure() -> dict[str, float]:
        hosts = attach_to_workers(workers=[agent])
        async with hosts.spawn_procs(per_host={"procs": 1}, name=f"bench_{side}") as procs:
            echo = await procs.spawn("echo", Echo)
            lat = (await _latency(echo.echo, 1000)).median_us
            tput = await _throughput(echo.echo, 5)
        return {"lat": lat, "tput": tput}

    print(json.dumps(uvloop.run(measure())), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    agent = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from danaus import run_worker_loop_forever; run_worker_loop_forever(address={agent!r})",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    got: dict[str, dict[str, list[float]]] = {
        s: {"lat": [], "tput": []} for s in ("attached", "direct")
    }
    try:
        assert worker.stdout is not None
        deadline = time.monotonic() + 60
        while "listening on" not in worker.stdout.readline():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the bench's host agent did not start")
        for _ in range(ROUNDS):
            for side in ("attached", "direct"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.bench_attach", "--side", side, agent],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    cwd=ROOT,
                    env=env,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"the {side} controller failed: {out.stderr[-2000:]}")
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                for key in ("lat", "tput"):
                    got[side][key].append(figures[key])
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        if worker.stdout is not None:
            worker.stdout.close()
    rows = []
    for key, figure in (
        ("lat", "call_one RTT us, sync endpoint, through the gateway"),
        ("tput", "calls/s, 1000 in flight, through the gateway"),
    ):
        on, off = (statistics.median(got[s][key]) for s in ("attached", "direct"))
        rows.append(
            {
                "figure": figure,
                "value": on,
                "floor (direct)": off,
                "ratio": on / off,
                "target": "reported",
            }
        )
    print(format_table(rows, ["figure", "value", "floor (direct)", "ratio", "target"]))
    print(
        f"medians of {ROUNDS} alternating runs, each a controller program of its own; one "
        "host agent on 127.0.0.1; the proc on it"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--side":
        _side(sys.argv[2], sys.argv[3])
    else:
        main()
