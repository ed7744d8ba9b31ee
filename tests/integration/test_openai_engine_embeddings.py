"""The `openai` engine's embeddings against a real local HTTP server that speaks OpenAI's
`/v1/embeddings` (aiohttp, port 0, one per test), scripted per request to inject faults: error
statuses, a hang, a reset, malformed answers, an upstream that ignores `encoding_format`."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest
from aiohttp import web

from schemas.openai import EmbeddingBody
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, RequestKey
from workers.engines.openai.circuit import BreakerConfig
from workers.engines.openai.engine import (
    CircuitOpen,
    OpenAIUpstreamConfig,
    OpenAIUpstreamEngine,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
)

# The engine's first-token and idle timeouts where a test expects success: a bound on a stall
# (a GC pause in this process, which runs the fake upstream too), not a speed to show.
STALL_S = 3.0
KEY_ENV = "LANEWAY_TEST_UPSTREAM_KEY"
KEY = "sk-test-upstream-embeddings-0123"
DIMS = 8


def upstream_vector(item: Any, dims: int) -> list[float]:
    """The fake upstream's 'model': a vector from the input's JSON, exactly representable in float32."""
    seed = sum(ord(c) for c in json.dumps(item))
    return [((seed * (i + 7)) % 97 - 48) / 64 for i in range(dims)]


@dataclass
class Plan:
    status: int = 200
    floats: bool = False  # ignore encoding_format: answer with float lists
    hang: bool = False
    reset: bool = False  # drop the connection after the headers
    body: bytes | None = None  # sent as it is (a 200 JSON answer)
    count: int | None = None  # answer this many vectors instead of one per input
    error: dict[str, Any] | None = None
    usage: bool = True


@dataclass
class Seen:
    path: str
    headers: Any  # case-insensitive, as received
    body: dict[str, Any]


@dataclass
class FakeUpstream:
    plans: list[Plan] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.seen.append(Seen(request.path, request.headers.copy(), body))
        plan = self.plans.pop(0) if self.plans else Plan()
        if plan.hang:
            await asyncio.sleep(30)
        if plan.status != 200:
            error = plan.error or {"message": "boom", "type": "server_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=plan.status)
        if plan.reset:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"object": "list", "data": [')
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp
        if plan.body is not None:
            return web.Response(body=plan.body, content_type="application/json")
        inputs = body["input"]
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        dims = body.get("dimensions", DIMS)
        data = []
        for i, item in enumerate(inputs[: plan.count] if plan.count is not None else inputs):
            vec = upstream_vector(item, dims)
            if plan.floats or body.get("encoding_format") != "base64":
                emb: Any = vec
            else:
                emb = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        data.reverse()  # the index, not the position, says which input a vector is for
        answer: dict[str, Any] = {"object": "list", "data": data, "model": body["model"]}
        if plan.usage:
            answer["usage"] = {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}
        return web.json_response(answer)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.url = f"http://{host}:{port}/v1"
    yield fake
    await runner.cleanup()


EngineFactory = Callable[..., Awaitable[OpenAIUpstreamEngine]]


@pytest.fixture
async def make_engine(upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EngineFactory]:
    monkeypatch.setenv(KEY_ENV, KEY)
    engines: list[OpenAIUpstreamEngine] = []

    async def make(**overrides: Any) -> OpenAIUpstreamEngine:
        config = OpenAIUpstreamConfig(
            base_url=upstream.url,
            model="up-embed",
            api_key_env=KEY_ENV,
            max_concurrency=4,
            connect_timeout_s=1.0,
            first_token_timeout_s=STALL_S,
            idle_timeout_s=STALL_S,
            total_timeout_s=10.0,
            retries=2,
            backoff_s=0.01,
            backoff_max_s=0.02,
            breaker=BreakerConfig(failure_threshold=3, min_volume=100, cooldown_s=5.0),
        )
        engine = OpenAIUpstreamEngine(replace(config, **overrides))
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.cleanup()


def request(
    input: Any = ("alpha", "beta", "alpha"), rid: str = "e1", *, extra: dict | None = None, **fields: Any
) -> EngineRequest:
    body = msgspec.convert(
        {"model": "client-embed", "input": list(input) if isinstance(input, tuple) else input, **fields}, EmbeddingBody
    )
    return EngineRequest(
        request_id=rid, body=body, extra=json.dumps(extra).encode() if extra else b"", klass="batch", confidence=True
    )


async def collect(engine: OpenAIUpstreamEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


def as_floats(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))  # explicitly little-endian float32


# -- the happy path ------------------------------------------------------------------------------


async def test_vectors_come_back_as_float32_le_bytes_in_input_order(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    engine = await make_engine()
    outs = await collect(engine, request())
    assert len(outs) == 1
    out = outs[0]
    assert out.finish_reason == "stop" and out.prompt_tokens == 9 and out.completion_tokens == 0
    assert [as_floats(v) for v in out.vectors] == [upstream_vector(t, DIMS) for t in ("alpha", "beta", "alpha")]
    assert out.vectors[0] == out.vectors[2] != out.vectors[1]
    assert all(len(v) == 4 * DIMS for v in out.vectors)


async def test_the_body_passes_through_with_the_upstream_model_and_base64(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    engine = await make_engine()
    req = request(
        ["one", "two"],
        dimensions=4,
        user="u-1",
        encoding_format="float",
        extra={"input_type": "query", "truncate_prompt_tokens": 16, "cache_salt": "not-yours"},
    )
    out = (await collect(engine, req))[0]
    (seen,) = upstream.seen
    assert seen.path == "/v1/embeddings"
    assert seen.body == {
        "model": "up-embed",
        "input": ["one", "two"],
        "encoding_format": "base64",
        "dimensions": 4,
        "user": "u-1",
        "input_type": "query",
        "truncate_prompt_tokens": 16,
    }
    assert seen.headers["Authorization"] == f"Bearer {KEY}"
    assert seen.headers["Accept"] == "application/json" and seen.headers["X-Request-Id"] == "e1"
    assert [len(v) for v in out.vectors] == [16, 16]


async def test_token_id_inputs(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    one = (await collect(engine, request([5, 6, 7], rid="ids-1")))[0]
    many = (await collect(engine, request([[5, 6, 7], [8]], rid="ids-2")))[0]
    assert upstream.seen[0].body["input"] == [5, 6, 7] and upstream.seen[1].body["input"] == [[5, 6, 7], [8]]
    assert len(one.vectors) == 1 and len(many.vectors) == 2 and one.vectors[0] == many.vectors[0]


async def test_an_upstream_answering_floats_is_converted(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    upstream.plans.append(Plan(floats=True))
    out = (await collect(engine, request(["x", "y"])))[0]
    assert [as_floats(v) for v in out.vectors] == [upstream_vector(t, DIMS) for t in ("x", "y")]


async def test_without_usage_the_prompt_is_estimated(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    upstream.plans.append(Plan(usage=False))
    out = (await collect(engine, request(["a" * 40, "b" * 40])))[0]
    assert out.prompt_tokens == 20 and len(out.vectors) == 2


async def test_capacity_counts_the_request_while_it_runs(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine(first_token_timeout_s=5.0)
    upstream.plans.append(Plan(hang=True))
    task = asyncio.ensure_future(collect(engine, request()))
    assert await eventually(lambda: engine.capacity().free_slots == 3)
    assert engine.capacity().running == {"batch": 1}
    await engine.abort(RequestKey("", "e1"))
    (out,) = await task
    assert out.finish_reason == "abort" and out.vectors == []
    assert engine.capacity().free_slots == 4 and engine.capacity().running == {}


# -- faults: retried (nothing was yielded), or refused -------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        Plan(status=503),
        Plan(status=429),
        Plan(reset=True),
        Plan(hang=True),
        Plan(body=b"{not json"),
        Plan(count=1),
        Plan(body=b'{"data": [{"index": 0, "embedding": "***"}]}'),
    ],
    ids=["503", "429", "reset", "hang", "undecodable", "too-few", "not-base64"],
)
async def test_retries_any_upstream_fault(upstream: FakeUpstream, make_engine: EngineFactory, fault: Plan) -> None:
    engine = await make_engine(first_token_timeout_s=1.0)
    upstream.plans.append(fault)
    out = (await collect(engine, request(["p", "q"])))[0]
    assert len(upstream.seen) == 2 and len(out.vectors) == 2 and out.finish_reason == "stop"


async def test_gives_up_after_the_configured_retries(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    upstream.plans.extend([Plan(status=500)] * 3)
    with pytest.raises(UpstreamError) as err:
        await collect(engine, request())
    assert err.value.status == 500 and not err.value.partial and len(upstream.seen) == 3


async def test_a_hang_times_out_as_first_token(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine(retries=0, first_token_timeout_s=0.3)
    upstream.plans.append(Plan(hang=True))
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout) as err:
        await collect(engine, request())
    assert err.value.phase == "first_token" and time.monotonic() - started < 2.0


async def test_400_is_the_requests_fault_and_names_the_param(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    engine = await make_engine()
    upstream.plans.append(
        Plan(
            status=400,
            error={
                "message": "dimensions is not supported by this model",
                "type": "invalid_request_error",
                "param": "dimensions",
            },
        )
    )
    with pytest.raises(UpstreamRejected) as err:
        await collect(engine, request(dimensions=3))
    assert err.value.param == "dimensions" and len(upstream.seen) == 1
    assert engine.breaker.state.name == "CLOSED"


async def test_the_breaker_counts_embedding_faults(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine(retries=0)
    upstream.plans.extend([Plan(status=502)] * 3)
    for i in range(3):
        with pytest.raises(UpstreamError):
            await collect(engine, request(rid=f"f{i}"))
    with pytest.raises(CircuitOpen):
        await collect(engine, request(rid="fast-fail"))
    assert len(upstream.seen) == 3 and engine.capacity().free_slots == 0


async def test_chat_and_embeddings_share_one_engine(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    """The same engine still sends generation bodies to the streaming endpoints."""
    from schemas.openai import ChatBody, Message
    from workers.engines.openai_wire import encode_body, path_of

    body = ChatBody(model="m", messages=[Message(role="user", content="hi")])
    assert path_of(body) == "/chat/completions" and b'"stream":true' in encode_body(body, "up")
    engine = await make_engine()
    out = (await collect(engine, request("solo")))[0]
    assert len(out.vectors) == 1 and math.isfinite(as_floats(out.vectors[0])[0])
