"""One controller of the spawn benchmark, in a fresh process so that nothing is warm:
``python -m bench._spawn_controller METHOD torch|light NPROCS ROUNDS``.

Prints one JSON line: the time of each round (spawn NPROCS procs, one actor each, one
``call()`` answered), and the median RSS and PSS of a proc (MiB) in the last round.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def _memory(pid: int) -> tuple[float, float]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields.get("Rss", 0) / 1024, fields.get("Pss", 0) / 1024


def main() -> None:
    method, kind, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    from danaus import this_host
    from danaus.config import config

    config.spawn_method = method
    if kind == "torch":
        from bench._torch_actor import TorchPing as Ping
    else:
        from bench._light_actor import LightPing as Ping  # type: ignore[assignment]
    times = []
    rss: list[float] = []
    pss: list[float] = []
    for _ in range(rounds):
        t = time.perf_counter()
        procs = this_host().spawn_procs(per_host={"procs": n})
        procs.spawn("ping", Ping).ping.call(1).get(timeout=300)
        times.append(time.perf_counter() - t)
        mem = [_memory(pid) for pid in procs.pids]
        rss = [m[0] for m in mem]
        pss = [m[1] for m in mem]
        procs.stop().get(timeout=60)
    print(
        json.dumps(
            {
                "times": times,
                "rss_mib": statistics.median(rss),
                "pss_mib": statistics.median(pss),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
