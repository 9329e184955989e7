"""Actors and a proc bootstrap for the telemetry tests: each proc keeps its finished
spans in memory (the OpenTelemetry SDK's in-memory exporter) for an endpoint to return."""

from __future__ import annotations

from danaus import Actor, current_rank, endpoint, span, traced

#: this process's in-memory exporter, once memory_spans() ran
_exporter: object = None


def memory_spans() -> None:
    """A proc's bootstrap (or the test's controller): an SDK tracer provider whose spans
    stay in memory, unless this process has one already."""
    global _exporter
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if _exporter is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _exporter = exporter


def finished_spans() -> list[dict[str, object]]:
    """This process's finished spans, oldest first, then forgotten."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert isinstance(_exporter, InMemorySpanExporter)
    out = []
    for s in _exporter.get_finished_spans():
        out.append(
            {
                "name": s.name,
                "trace": s.context.trace_id,
                "id": s.context.span_id,
                "parent": s.parent.span_id if s.parent is not None else None,
                "kind": s.kind.name,
                "attributes": dict(s.attributes or {}),
                "status": s.status.status_code.name,
            }
        )
    _exporter.clear()
    return out


class Back(Actor):
    @endpoint
    def work(self, x: int) -> int:
        with span("inner"):  # a user's span, inside the endpoint's
            return x + 1

    @endpoint
    async def awork(self, x: int) -> int:
        return await _helper(x)

    @endpoint
    def fails(self) -> None:
        raise ValueError("no \udcff")

    @endpoint
    def spans(self) -> list[dict[str, object]]:
        return finished_spans()


@traced
async def _helper(x: int) -> int:
    return x * 2


class Front(Actor):
    @endpoint
    def ask(self, back: Back) -> int:
        return back.work.call_one(1).get(timeout=30) + int(current_rank().rank)

    @endpoint
    async def aask(self, back: Back) -> int:
        return await back.awork.call_one(2)

    @endpoint
    def spans(self) -> list[dict[str, object]]:
        return finished_spans()
