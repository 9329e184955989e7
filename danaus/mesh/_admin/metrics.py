"""Prometheus metrics of the controller's meshes, opt-in: ``danaus.serve_metrics(port)``.

The exposition format is prometheus_client's (the reference client library, kept by
the Prometheus project; an extra, ``danaus[metrics]``), not hand-written. Each scrape
asks every live proc mesh of this process for ``stats()`` (bounded), so the figures are
as of the scrape and nothing is collected between scrapes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._process import process

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

log = logging.getLogger("danaus.metrics")

__all__ = ["MetricsServer", "serve_metrics"]

#: how long one scrape waits for a mesh's answer (s)
SCRAPE_TIMEOUT = 10.0


class _Collector:
    """Builds the metric families at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from .._proc_mesh import live_proc_meshes

        proc_labels = ["procs", "rank", "host", "pid"]
        actor_labels = ["procs", "rank", "mesh", "actor"]
        gauges = {
            "cpu": GaugeMetricFamily(
                "danaus_proc_cpu_percent",
                "CPU use of a proc since the last scrape",
                labels=proc_labels,
            ),
            "rss": GaugeMetricFamily(
                "danaus_proc_rss_bytes", "Resident memory of a proc", labels=proc_labels
            ),
            "conns": GaugeMetricFamily(
                "danaus_proc_connections", "Open control connections of a proc", labels=proc_labels
            ),
            "mailbox": GaugeMetricFamily(
                "danaus_actor_mailbox_depth", "Messages waiting for an actor", labels=actor_labels
            ),
            "in_flight": GaugeMetricFamily(
                "danaus_actor_in_flight", "Endpoints of an actor running now", labels=actor_labels
            ),
            "longest": GaugeMetricFamily(
                "danaus_actor_running_seconds",
                "How long an actor's longest-running endpoint has run (of those not "
                "marked long_running)",
                labels=actor_labels,
            ),
        }
        counters = {
            "bytes_in": CounterMetricFamily(
                "danaus_proc_bytes_in", "Bytes a proc read from its connections", labels=proc_labels
            ),
            "bytes_out": CounterMetricFamily(
                "danaus_proc_bytes_out", "Bytes a proc wrote to its connections", labels=proc_labels
            ),
            "messages": CounterMetricFamily(
                "danaus_actor_messages",
                "Messages an actor handled, per endpoint",
                labels=[*actor_labels, "endpoint"],
            ),
            "errors": CounterMetricFamily(
                "danaus_actor_errors",
                "Messages whose endpoint raised, per endpoint",
                labels=[*actor_labels, "endpoint"],
            ),
        }
        stuck = CounterMetricFamily(
            "danaus_stuck_reports",
            "Stuck-endpoint reports this controller received (last 256 kept)",
        )
        stuck.add_metric([], len(process.stuck_reports))
        for procs in live_proc_meshes():
            try:
                records = procs.stats().get(timeout=SCRAPE_TIMEOUT).values()
            except Exception as e:  # a mesh that does not answer must not fail the scrape
                log.warning("metrics: proc mesh %r did not answer: %s", procs.name, e)
                continue
            for rank, rec in enumerate(records):
                pl = [procs.name, str(rank), str(rec["host"]), str(rec["pid"])]
                gauges["cpu"].add_metric(pl, rec["cpu_percent"])
                gauges["rss"].add_metric(pl, rec["rss_bytes"])
                gauges["conns"].add_metric(pl, rec["connections"])
                counters["bytes_in"].add_metric(pl, rec["bytes_in"])
                counters["bytes_out"].add_metric(pl, rec["bytes_out"])
                for a in rec["actors"]:
                    al = [procs.name, str(rank), a["mesh"], a["actor"]]
                    gauges["mailbox"].add_metric(al, a["mailbox"])
                    gauges["in_flight"].add_metric(al, a["in_flight"])
                    long = set(a.get("long_running", ()))  # (a shell's: as long as it serves)
                    running = [s for m, s in a["running"] if m not in long]
                    gauges["longest"].add_metric(al, max(running, default=0.0))
                    for endpoint, n in a["handled"].items():
                        counters["messages"].add_metric([*al, endpoint], n)
                    for endpoint, n in a["errors"].items():
                        counters["errors"].add_metric([*al, endpoint], n)
        yield from gauges.values()
        yield from counters.values()
        yield stuck


class MetricsServer:
    """A running ``/metrics`` endpoint: ``port``, and ``close()``."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port: int = server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __repr__(self) -> str:
        return f"<MetricsServer http://127.0.0.1:{self.port}/metrics>"


def serve_metrics(port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve Prometheus metrics of this process's meshes at ``http://addr:port/metrics``
    (``port=0``: a free one, see ``.port``). Needs ``prometheus_client``
    (``pip install 'danaus[metrics]'``)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as e:
        raise ImportError(
            "danaus.serve_metrics needs prometheus_client: pip install 'danaus[metrics]'"
        ) from e
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    server, thread = start_http_server(port, addr, registry)
    return MetricsServer(server, thread)
