"""What OpenTelemetry tracing costs a call: ``call_one`` round trip to a sync endpoint
and 1,000-in-flight throughput with telemetry off (the default) and on (the controller
inside a span, so every call carries its context and the callee makes a span per call;
SDK providers exporting nowhere, ``OTEL_TRACES_EXPORTER=none``, so what is measured is
danaus's part and the SDK's span making, not an exporter's network), in the same run,
alternating in rounds. The floor is the telemetry-off figure.

What telemetry off costs against a build without it is measured as an A/B of whole
runs between two checkouts (see docs/benchmarks.md); here the off figure is the floor.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import uvloop

import danaus
from danaus import span, this_host

from ._stats import on_off_table
from .bench_runtime import Echo, _latency, _throughput

ROUNDS = 9


async def _measure() -> dict[str, dict[str, list[float]]]:
    got: dict[str, dict[str, list[float]]] = {s: {"lat": [], "tput": []} for s in ("on", "off")}
    os.environ.setdefault("OTEL_TRACES_EXPORTER", "none")
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
    host = this_host()
    on_env = {"DANAUS_TELEMETRY": "1"}
    async with (
        host.spawn_procs(per_host={"procs": 1}, name="traced", env=on_env) as on,
        host.spawn_procs(per_host={"procs": 1}, name="untraced") as off,
    ):
        echoes: dict[str, Any] = {
            "on": await on.spawn("echo", Echo),
            "off": await off.spawn("echo", Echo),
        }

        def side(name: str) -> contextlib.AbstractContextManager[object]:
            danaus.config.telemetry = name == "on"
            return span("bench") if name == "on" else contextlib.nullcontext()

        try:
            for _ in range(ROUNDS):
                for name, echo in echoes.items():
                    with side(name):
                        got[name]["lat"].append((await _latency(echo.echo, 1000)).median_us)
            for _ in range(ROUNDS):
                for name, echo in echoes.items():
                    with side(name):
                        got[name]["tput"].append(await _throughput(echo.echo, 10))
        finally:
            danaus.config.telemetry = False
    return got


def main() -> None:
    got = uvloop.run(_measure())
    print(on_off_table(got, "telemetry", "floor (off)", ("reported", "reported")))
    print(
        f"medians of {ROUNDS} alternating rounds; on: a span per call in the callee, the "
        "caller's context in every message, SDK providers exporting nowhere"
    )


if __name__ == "__main__":
    main()
