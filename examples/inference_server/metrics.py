"""The inference server's request counts and latency quantiles, and their Prometheus
text for ``GET /metrics``."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence


class Metrics:
    """Counters and a window of recent latencies, rendered in Prometheus text format."""

    QUANTILES = (0.5, 0.9, 0.99)

    def __init__(self, window: int = 4096) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.latency: collections.deque[float] = collections.deque(maxlen=window)
        self.first_token: collections.deque[float] = collections.deque(maxlen=window)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.tokens = 0
        self.replica_failures = 0
        self.respawns = 0
        self.reloads = 0
        self.reload_bytes = 0

    def observe(self, status: int | str, seconds: float) -> None:
        self.requests[str(status)] += 1
        if status == 200:
            self.latency.append(seconds)
            self.latency_sum += seconds
            self.latency_count += 1

    def render(self, healthy: int, size: int) -> str:
        lines = [
            "# HELP inference_requests_total POST /generate requests by HTTP status "
            "(499: the client went away).",
            "# TYPE inference_requests_total counter",
            *(
                f'inference_requests_total{{status="{s}"}} {n}'
                for s, n in sorted(self.requests.items())
            ),
        ]
        for name, window, what in (
            (
                "inference_request_latency_seconds",
                self.latency,
                "Time from request to last token (successful requests).",
            ),
            (
                "inference_first_token_seconds",
                self.first_token,
                "Time from request to first token.",
            ),
        ):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} summary"]
            ordered = sorted(window)
            for q in self.QUANTILES:
                lines.append(f'{name}{{quantile="{q}"}} {_quantile(ordered, q):.6f}')
            if name == "inference_request_latency_seconds":
                lines += [
                    f"{name}_sum {self.latency_sum:.6f}",
                    f"{name}_count {self.latency_count}",
                ]
            else:
                lines += [f"{name}_sum {sum(ordered):.6f}", f"{name}_count {len(ordered)}"]
        for name, kind, value, what in (
            ("inference_tokens_total", "counter", self.tokens, "Tokens streamed."),
            (
                "inference_replica_failures_total",
                "counter",
                self.replica_failures,
                "Replicas that died.",
            ),
            (
                "inference_replica_respawns_total",
                "counter",
                self.respawns,
                "Replacement replica meshes swapped in.",
            ),
            ("inference_reloads_total", "counter", self.reloads, "Weight reloads."),
            (
                "inference_reload_bytes_total",
                "counter",
                self.reload_bytes,
                "Bytes moved by weight reloads.",
            ),
            ("inference_replicas_healthy", "gauge", healthy, "Replicas serving now."),
            ("inference_replicas", "gauge", size, "Replicas configured."),
        ):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted samples (NaN when there are none)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
