"""OpenTelemetry under `laneway up`: one trace per request across bridge → broker → worker,
exported over OTLP/HTTP to a collector (a real HTTP server decoding the real protobuf)."""

from __future__ import annotations

import subprocess
import sys

import openai
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from loadtest.processes import LanewayUp
from tests.wait import eventually

KEY = "sk-trace-test"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _value(any_value) -> object:
    return getattr(any_value, any_value.WhichOneof("value"))


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, flattened."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            service = {a.key: _value(a.value) for a in resource_spans.resource.attributes}["service.name"]
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "service": service,
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            **{a.key: _value(a.value) for a in span.attributes},
                        }
                    )
        return web.Response(content_type="application/x-protobuf", body=b"")

    async def __aenter__(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    def trace_of(self, request_id: str) -> dict[str, list[dict]]:
        """service → spans naming this request, and every span of their traces."""
        traces = {s["trace"] for s in self.spans if s.get("laneway.request_id") == request_id}
        by_service: dict[str, list[dict]] = {}
        for span in self.spans:
            if span["trace"] in traces:
                by_service.setdefault(span["service"], []).append(span)
        return by_service


async def test_one_trace_crosses_bridge_broker_and_worker(tmp_path, monkeypatch):
    async with Collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms, not 5 s
        async with LanewayUp(tmp_path / "lw", KEY, ["--pii", "off"]) as up:
            client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY)
            parent = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
            raw = await client.chat.completions.with_raw_response.create(
                model="laneway-sim",
                max_tokens=4,
                messages=[{"role": "user", "content": "Hello!"}],
                extra_headers={"traceparent": parent},
            )
            request_id = raw.headers["x-request-id"]
            await client.close()

            def complete() -> bool:
                return {"laneway-bridge", "laneway-broker", "laneway-worker"} <= set(collector.trace_of(request_id))

            assert await eventually(complete), collector.spans
    trace = collector.trace_of(request_id)
    spans = [s for service in trace.values() for s in service]
    # One trace, the client's: the bridge continued the traceparent it was sent.
    assert {s["trace"] for s in spans} == {CLIENT_TRACE}
    (edge,) = [s for s in trace["laneway-bridge"] if s.get("laneway.request_id") == request_id]
    assert edge["parent"] == "00f067aa0ba902b7"
    # The broker's and the worker's spans hang under the edge's span.
    ids = {s["id"] for s in spans}
    for service in ("laneway-broker", "laneway-worker"):
        for span in trace[service]:
            assert span["parent"] in ids and span["laneway.request_id"] == request_id
    (work,) = trace["laneway-worker"]
    assert work["name"] == "laneway.worker.generate" and work["laneway.completion_tokens"] == 4
    assert work["laneway.finish_reason"] == "length"


def test_tracing_off_loads_no_opentelemetry():
    """Off (the default), the product's processes never import OpenTelemetry."""
    code = (
        "import sys, broker.app, bridge.app, workers.runner, laneway.cli; "
        "from core.tracing import configure; configure('x', None); "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_endpoint_without_opentelemetry_installed_leaves_tracing_off_and_says_so():
    code = (
        "import sys, logging; sys.modules['opentelemetry'] = None; logging.basicConfig(); "
        "from core.tracing import configure; "
        "print(configure('laneway-broker', 'http://127.0.0.1:1').enabled)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False" and "pip install 'laneway[otel]'" in out.stderr
