"""Spawn benchmark: procs started by the fork server against fresh interpreters (exec).

Each case runs in a fresh controller process (``bench._spawn_controller``), so the first
round pays for everything a first spawn pays (the fork server's start and its imports);
later rounds reuse it. The floor is the same case started with ``exec`` in the same run,
and ``python -c pass`` (an interpreter's start) is printed next to them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from ._stats import format_table

_CASES = [("torch", 8, 3), ("light", 8, 3), ("light", 64, 2)]
_TARGETS = {("torch", 8): 0.8, ("light", 8): 0.25, ("light", 64): 2.0}


def _run(method: str, kind: str, n: int, rounds: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench._spawn_controller", method, kind, str(n), str(rounds)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _interpreter_start() -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    floor = _interpreter_start()
    print(f"floor: one `python -c pass` = {floor * 1e3:.0f} ms")
    rows = []
    for kind, n, rounds in _CASES:
        res = {m: _run(m, kind, n, rounds) for m in ("exec", "fork")}
        warm = {m: min(r["times"][1:]) for m, r in res.items()}
        target = _TARGETS[(kind, n)]
        rows.append(
            {
                "case": f"{n} procs, {kind} actor module: spawn + first call()",
                "exec first/warm": f"{res['exec']['times'][0]:.2f} / {warm['exec']:.2f} s",
                "fork first/warm": f"{res['fork']['times'][0]:.2f} / {warm['fork']:.2f} s",
                "exec/fork (warm)": f"{warm['exec'] / warm['fork']:.1f}x",
                "target (fork)": f"<= {target} s: {'met' if warm['fork'] <= target else 'MISSED'}",
                "proc RSS/PSS exec": f"{res['exec']['rss_mib']:.0f}/{res['exec']['pss_mib']:.0f} MiB",
                "proc RSS/PSS fork": f"{res['fork']['rss_mib']:.0f}/{res['fork']['pss_mib']:.0f} MiB",
            }
        )
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
