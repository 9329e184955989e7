"""Traces and metrics on OpenTelemetry (the ``telemetry`` extra): a span per endpoint call
in the callee, parented to the caller's span across procs, and the user's ``span()``,
``@traced`` and ``get_meter()`` (Monarch's names).

With ``config.telemetry`` off (the default) a call carries no trace context and the
callee starts no span: the whole cost is one attribute read on each side. On, the
caller's current span context travels in the message (``Call.trace``, a W3C
``traceparent``) and the callee runs the endpoint inside a ``SERVER`` span named
``Class.method``, a child of it. ``span()``, ``traced`` and ``get_meter()`` work on or
off: off, they use whatever OpenTelemetry provider the program set (a no-op one unless
it set one).

Providers and exporters are configured the OpenTelemetry way. A program (or a proc's
``bootstrap``) that sets its own SDK provider keeps it; otherwise, with telemetry on,
danaus sets SDK providers in each process that exports what the standard variables say:
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (``otlp``, the default, over
OTLP/HTTP; ``console``; ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the rest of the
exporter's variables, ``OTEL_SERVICE_NAME`` (default ``danaus``), ``OTEL_BSP_*``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ParamSpec, TypeVar, overload

from ._process import process

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Span, Tracer

    from ._actor_thread import JobFn

__all__ = ["get_meter", "incoming", "otlp_traces_url", "outgoing_trace", "span", "traced"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _needs_otel() -> ImportError:
    return ImportError(
        "danaus telemetry needs OpenTelemetry: pip install 'danaus[telemetry]' "
        "(opentelemetry-api, -sdk and -exporter-otlp-proto-http)"
    )


def _exporters(variable: str) -> list[str]:
    names = [n.strip().lower() for n in os.environ.get(variable, "otlp").split(",")]
    unknown = [n for n in names if n not in ("otlp", "console", "none", "")]
    if unknown:
        raise ValueError(
            f"{variable}={os.environ[variable]!r}: danaus exports to otlp, console or none, "
            f"not {', '.join(unknown)}"
        )
    return [n for n in names if n not in ("none", "")]


def otlp_traces_url() -> str | None:
    """Where this process's traces go over OTLP/HTTP, as the ``OTEL_*`` variables say
    (the exporter's default endpoint where none is named); None when they do not go
    over OTLP."""
    if "otlp" not in _exporters("OTEL_TRACES_EXPORTER"):
        return None
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4318"
    )


def _install_providers() -> None:
    """SDK providers for this process, exporting as the ``OTEL_*`` variables say, unless
    the program set its own."""
    from opentelemetry import metrics, trace

    service = os.environ.get("OTEL_SERVICE_NAME", "danaus")
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        for name in _exporters("OTEL_TRACES_EXPORTER"):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            else:
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
    if type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            MetricReader,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource

        readers: list[MetricReader] = []
        for name in _exporters("OTEL_METRICS_EXPORTER"):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                    OTLPMetricExporter,
                )

                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
            else:
                readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
        resource = Resource.create({"service.name": service})
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def tracer() -> Tracer:
    """danaus's tracer (with telemetry on, this process's providers installed first)."""
    from ..config import config

    p = process
    if p.tracer is None or (config.telemetry and not p.tracer_installed):
        with p.tracer_lock:
            try:
                from opentelemetry import trace
            except ImportError:
                raise _needs_otel() from None
            if config.telemetry and not p.tracer_installed:
                _install_providers()
                p.tracer_installed = True
            if p.tracer is None:
                p.tracer = trace.get_tracer("danaus")  # (follows a provider set later)
    return p.tracer


def outgoing_trace() -> str:
    """The current span context, as the ``traceparent`` a call carries ("" if none)."""
    tracer()  # (providers first: the current span may be ours)
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def incoming(name: str, trace: str, attributes: dict[str, str | int]) -> Iterator[Span]:
    """The callee's span of one endpoint call, a child of the caller's ``trace``."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    parent = extract({"traceparent": trace}) if trace else None
    with tracer().start_as_current_span(
        name, context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as s:
        yield s


def run_in_span(
    name: str, trace: str, attributes: dict[str, str | int], fn: JobFn, /,
    *args: object, **kwargs: object,
) -> object:  # fmt: skip
    """``fn(*args, **kwargs)`` (a sync endpoint) inside its call's span."""
    with incoming(name, trace, attributes):
        return fn(*args, **kwargs)


async def await_in_span(
    name: str, trace: str, attributes: dict[str, str | int], coro: Coroutine[object, object, T]
) -> T:
    """``await coro`` (an async endpoint) inside its call's span."""
    with incoming(name, trace, attributes):
        return await coro


@contextmanager
def span(name: str) -> Iterator[Span]:
    """``with span("load"):``: a span of the block, a child of the current one (an
    endpoint call's, in an actor), in danaus's tracer (Monarch's ``span``)."""
    with tracer().start_as_current_span(name) as s:
        yield s


@overload
def traced(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def traced(*, name: str) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def traced(
    fn: Callable[P, R] | None = None, /, *, name: str | None = None
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """``@traced`` (or ``@traced(name="x")``): each call of the function, sync or async,
    runs in a span named after it (Monarch's ``traced``)."""

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        label = name if name is not None else f.__name__
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> object:
                with span(label):
                    return await f(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(f)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(label):
                return f(*args, **kwargs)

        return run

    return decorate(fn) if fn is not None else decorate


def get_meter(name: str = "danaus") -> Meter:
    """An OpenTelemetry meter (Monarch's ``get_meter()``): ``get_meter().create_counter(
    "steps").add(1)``. Exported as the ``OTEL_METRICS_*`` variables say, with telemetry
    on; through the program's own provider otherwise."""
    tracer()  # (providers first)
    from opentelemetry import metrics

    return metrics.get_meter(name)
