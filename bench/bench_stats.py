"""What keeping per-actor stats costs: ``call_one`` round trip and 1,000-in-flight
throughput to an actor that keeps them (``config.actor_stats``, the default) and to one
that does not, measured in the same run, alternating in rounds so that the machine's
noise falls on both alike. Both actors live in the same proc (the second spawned after
the proc's setting was turned off: an actor reads it when it starts), so where the
scheduler puts the processes cannot favour either. The floor of each figure is the
stats-off one.
"""

from __future__ import annotations

from typing import Any

import uvloop

from danaus import endpoint, this_host

from ._stats import on_off_table
from .bench_runtime import Echo, _latency, _throughput

ROUNDS = 15


class StatsEcho(Echo):
    @endpoint
    def keep_stats(self, on: bool) -> None:
        from danaus import config

        config.actor_stats = on


async def _measure() -> dict[str, dict[str, list[float]]]:
    got: dict[str, dict[str, list[float]]] = {
        side: {"lat": [], "tput": []} for side in ("on", "off")
    }
    host = this_host()
    async with (
        host.spawn_procs(
            per_host={"procs": 1}, name="stats_on", env={"DANAUS_ACTOR_STATS": "1"}
        ) as on,
        host.spawn_procs(
            per_host={"procs": 1}, name="stats_off", env={"DANAUS_ACTOR_STATS": "0"}
        ) as off,
    ):
        echoes: dict[str, Any] = {
            "on": await on.spawn("echo", Echo),
            "off": await off.spawn("echo", Echo),
        }
        # Latency rounds first, then throughput rounds: a latency measured right after a
        # burst of 1,000-in-flight calls pays for that burst's aftermath (seen: 15%).
        for _ in range(ROUNDS):
            for side, echo in echoes.items():
                got[side]["lat"].append((await _latency(echo.echo, 1000)).median_us)
        for _ in range(ROUNDS):
            for side, echo in echoes.items():
                got[side]["tput"].append(await _throughput(echo.echo, 10))
        # the switch reached the procs: only the stats-on actor counted its messages
        counted = [(await e.stats()).values()[0]["handled"] for e in echoes.values()]
        assert counted[0].get("echo", 0) > 0 and counted[1] == {}, counted
    return got


def main() -> None:
    got = uvloop.run(_measure())
    print(on_off_table(got, "stats", "floor (stats off)", ("<= 1.05x", ">= 0.95x")))
    print(f"\n(medians of {ROUNDS} alternating rounds; unpinned)")


if __name__ == "__main__":
    main()
