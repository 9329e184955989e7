"""Traces and metrics on OpenTelemetry: a call chain controller -> actor -> actor is one
trace with each span a child of its caller's (the SDK's in-memory exporter in every
process), a real OTLP/HTTP receiver gets the exporters' batches, and telemetry off
carries nothing."""

from __future__ import annotations

import http.server
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import danaus
from danaus import span, this_host

from .telemetry_actors import Back, Front, finished_spans, memory_spans

pytest.importorskip("opentelemetry.sdk")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    memory_spans()  # this process's spans in memory too
    finished_spans()  # (none left from earlier tests)
    monkeypatch.setattr(danaus.config, "telemetry", True)
    yield


def by_name(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in spans}


async def test_a_call_chain_is_one_trace_of_parented_spans(telemetry: None) -> None:
    env = {"DANAUS_TELEMETRY": "1"}
    async with this_host().spawn_procs(
        per_host={"procs": 2}, name="traced", bootstrap=memory_spans, env=env
    ) as procs:
        backs = await procs.spawn("back", Back)
        front = (await procs.spawn("front", Front)).slice(procs=0)
        back = backs.slice(procs=1)
        with span("client") as root:
            assert await front.ask.call_one(back) == 2  # sync endpoints
            assert await front.aask.call_one(back) == 4  # async ones
        here = by_name(finished_spans())
        front_spans = await front.spans.call_one()
        back_spans = await back.spans.call_one()
    client = here["client"]
    assert client["id"] == root.get_span_context().span_id and client["parent"] is None
    ask, aask = by_name(front_spans)["Front.ask"], by_name(front_spans)["Front.aask"]
    work, awork = by_name(back_spans)["Back.work"], by_name(back_spans)["Back.awork"]
    inner, helper = by_name(back_spans)["inner"], by_name(back_spans)["_helper"]
    # one trace: the controller's span, each endpoint's a child of its caller's
    assert {s["trace"] for s in (client, ask, aask, work, awork, inner, helper)} == {
        client["trace"]
    }
    assert ask["parent"] == client["id"] and aask["parent"] == client["id"]
    assert work["parent"] == ask["id"] and awork["parent"] == aask["id"]
    assert inner["parent"] == work["id"] and helper["parent"] == awork["id"]
    assert ask["kind"] == "SERVER" and ask["attributes"]["danaus.mesh"] == "front"
    assert work["attributes"]["danaus.rank"] == 1
    assert work["attributes"]["danaus.endpoint"] == "work"


async def test_casts_and_failures_are_traced(
    telemetry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"DANAUS_TELEMETRY": "1"}
    async with this_host().spawn_procs(
        per_host={"procs": 3}, name="cast", bootstrap=memory_spans, env=env
    ) as procs:
        backs = await procs.spawn("back", Back)
        monkeypatch.setattr(danaus.config, "cast_fanout", 1)  # down a tree of procs
        with span("cast") as root:
            got = await backs.work.call(5)
            with pytest.raises(ValueError):
                await backs.slice(procs=2).fails.call_one()
        assert sorted(got.values()) == [6, 6, 6]
        per_proc = [await backs.slice(procs=r).spans.call_one() for r in range(3)]
    root_id = root.get_span_context().span_id
    works = [by_name(spans)["Back.work"] for spans in per_proc]
    assert all(w["parent"] == root_id for w in works)
    failed = by_name(per_proc[2])["Back.fails"]
    assert failed["parent"] == root_id and failed["status"] == "ERROR"


async def test_telemetry_off_carries_no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    memory_spans()
    finished_spans()
    monkeypatch.setattr(danaus.config, "telemetry", False)
    async with this_host().spawn_procs(
        per_host={"procs": 1}, name="untraced", bootstrap=memory_spans
    ) as procs:
        back = await procs.spawn("back", Back)
        with span("client"):  # the user's own spans still work
            assert await back.work.call_one(1) == 2
        spans = await back.spans.call_one()
    assert [s["name"] for s in spans] == ["inner"]  # no endpoint span
    assert spans[0]["parent"] is None  # and no context from the caller
    assert [s["name"] for s in finished_spans()] == ["client"]


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each request's path and body."""

    got: list[tuple[str, bytes]] = []
    arrived = threading.Condition()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.arrived:
            self.got.append((self.path, body))
            self.arrived.notify_all()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_otlp_exporters_batches_reach_a_receiver(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    program = tmp_path / "traced.py"
    program.write_text(
        textwrap.dedent(
            """
            import danaus
            from danaus import Actor, endpoint, get_meter, span, this_host

            class Echo(Actor):
                @endpoint
                def ping(self, x):
                    get_meter().create_counter("pings").add(1)
                    return x

            procs = this_host().spawn_procs(per_host={"procs": 2})
            echo = procs.spawn("echo", Echo)
            with span("client"):
                print(echo.ping.call(1).get())
            get_meter().create_counter("steps").add(3)
            procs.stop().get()
            """
        )
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DANAUS_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "OTEL_SERVICE_NAME": "telemetry-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    }
    try:
        run = subprocess.run(
            [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=90
        )
        assert run.returncode == 0, run.stderr
        spans: list[str] = []
        metrics: list[str] = []
        for path, body in list(_Receiver.got):
            if path == "/v1/traces":
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    service = [
                        a.value.string_value
                        for a in rs.resource.attributes
                        if a.key == "service.name"
                    ]
                    assert service == ["telemetry-test"]
                    spans += [s.name for ss in rs.scope_spans for s in ss.spans]
            elif path == "/v1/metrics":
                req = ExportMetricsServiceRequest.FromString(body)
                metrics += [
                    m.name
                    for rm in req.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                ]
        # the controller's span and each proc's endpoint span, exported at exit at the latest
        assert sorted(spans) == ["Echo.ping", "Echo.ping", "client"], spans
        assert "steps" in metrics and "pings" in metrics, metrics
    finally:
        server.shutdown()
        server.server_close()
