"""OpenTelemetry spans across bridge → broker → worker: one trace per request.

Off unless an OTLP endpoint is configured (the CLI reads `OTEL_EXPORTER_OTLP_ENDPOINT` and calls
`configure`). Then each process exports its spans over OTLP/HTTP, and the W3C `traceparent` of the
bridge's span travels in `GenerateRequest.traceparent`, so the broker's and the worker's spans
join the client's trace. Off, `tracer()` is a no-op that imports nothing of OpenTelemetry: a
call costs one method dispatch, and requests carry no traceparent.

Spans after the fact (`record`) take explicit start and end times: the broker and the worker know
when a phase began only once it ends, and keeping a live span object per waiting request would
cost memory for thousands of them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("laneway.tracing")


class Span:
    """A span in progress; `traceparent` is what a child in another process takes as parent."""

    traceparent = ""

    def set(self, **attrs: Any) -> None:
        pass

    def end(self, **attrs: Any) -> None:
        pass


class Tracing:
    """The no-op tracer (tracing off)."""

    enabled = False
    _NOOP = Span()

    def start(self, name: str, parent: str = "", **attrs: Any) -> Span:
        return self._NOOP

    def record(self, name: str, parent: str, start_s: float, end_s: float | None = None, **attrs: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


class _OtelSpan(Span):
    def __init__(self, span: Any, traceparent: str) -> None:
        self._span = span
        self.traceparent = traceparent

    def set(self, **attrs: Any) -> None:
        self._span.set_attributes(_clean(attrs))

    def end(self, **attrs: Any) -> None:
        if attrs:
            self._span.set_attributes(_clean(attrs))
        self._span.end()


class OtelTracing(Tracing):
    """Spans exported over OTLP/HTTP in batches (the SDK's background thread does the I/O)."""

    enabled = True

    def __init__(self, service: str, endpoint: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self._provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"))
        )
        self._tracer = self._provider.get_tracer("laneway")
        self._propagator = TraceContextTextMapPropagator()
        self._in_context = set_span_in_context

    def _parent(self, traceparent: str) -> Any:
        return self._propagator.extract({"traceparent": traceparent}) if traceparent else None

    def start(self, name: str, parent: str = "", **attrs: Any) -> Span:
        span = self._tracer.start_span(name, context=self._parent(parent), attributes=_clean(attrs))
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._in_context(span))
        return _OtelSpan(span, carrier.get("traceparent", ""))

    def record(self, name: str, parent: str, start_s: float, end_s: float | None = None, **attrs: Any) -> None:
        span = self._tracer.start_span(
            name, context=self._parent(parent), attributes=_clean(attrs), start_time=int(start_s * 1e9)
        )
        span.end(end_time=int((time.time() if end_s is None else end_s) * 1e9))

    def shutdown(self) -> None:
        self._provider.shutdown()  # flushes what is batched


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attribute values are str/bool/int/float: drop unset ones."""
    return {f"laneway.{k}": v for k, v in attrs.items() if v is not None and v != ""}


_TRACER: Tracing = Tracing()


def tracer() -> Tracing:
    return _TRACER


def configure(service: str, endpoint: str | None) -> Tracing:
    """Called once by a process's entry point; an empty endpoint leaves tracing off."""
    global _TRACER
    if endpoint:
        try:
            _TRACER = OtelTracing(service, endpoint)
        except ImportError as exc:  # serving matters more than its traces: say so, run on
            log.error(
                "tracing stays off: OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not "
                "installed (pip install 'laneway[otel]'): %s",
                exc,
            )
            return _TRACER
        log.info("tracing: spans of %s go to %s over OTLP/HTTP", service, endpoint)
    return _TRACER
