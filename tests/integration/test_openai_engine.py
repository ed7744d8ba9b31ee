"""The `openai` engine against a real local HTTP server that speaks the OpenAI streaming API.

The server (aiohttp, port 0, one per test) follows a script of `Plan`s, one per request it
receives, to inject faults: error statuses, a hang before the first byte, a reset mid-stream,
slow first tokens and slow gaps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest
from aiohttp import web

from core.ports import free_port
from schemas.frames import TokenLogprob, ToolCallDelta, TopLogprob
from schemas.openai import ChatBody, CompletionBody, Message, Tool
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, RequestKey
from workers.engines.openai.circuit import BreakerConfig, BreakerState
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
KEY = "sk-test-upstream-0123456789"


# -- the fake upstream ---------------------------------------------------------------------------


@dataclass
class Plan:
    status: int = 200
    tokens: tuple[str, ...] = ("Hello", ",", " world")
    usage: bool = True
    hang: bool = False  # never answer: no status line, no byte
    first_delay: float = 0.0  # after the headers and role chunk, before the first token
    gap: float = 0.0  # between tokens
    reset_after: int | None = None  # drop the connection after this many tokens
    retry_after: str | None = None
    error: dict[str, Any] | None = None
    chunks: tuple[dict[str, Any], ...] | None = None  # sent as they are instead of `tokens`, then [DONE]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes


class Disconnected(Exception):
    pass


@dataclass
class FakeUpstream:
    plans: list[Plan] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    def script(self, *plans: Plan) -> None:
        self.plans.extend(plans)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(Seen(request.path, dict(request.headers), json.loads(raw), raw))
        plan = self.plans.pop(0) if self.plans else Plan()
        try:
            if plan.hang:
                await self._sleep(request, 30.0)
            if plan.status != 200:
                headers = {"Retry-After": plan.retry_after} if plan.retry_after else {}
                error = plan.error or {"message": "boom", "type": "server_error", "param": None, "code": None}
                return web.json_response({"error": error}, status=plan.status, headers=headers)
            return await self._stream(request, plan, chat=request.path.endswith("/chat/completions"))
        except Disconnected:
            self.disconnected.set()
            raise web.HTTPBadRequest() from None  # nobody is listening any more

    async def _stream(self, request: web.Request, plan: Plan, *, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def event(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            try:
                await resp.write(f"data: {data}\n\n".encode())
            except ConnectionResetError:
                raise Disconnected from None

        def chunk(text: str | None, finish: str | None = None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text} if text is not None else {}
            else:
                choice["text"] = text or ""
            return {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up", "choices": [choice]}

        if chat:
            await event(
                {
                    "id": "cmpl-1",
                    "created": 1,
                    "model": "up",
                    "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
                }
            )
        await resp.write(b": keep-alive comment\n\n")
        if plan.chunks is not None:
            for payload in plan.chunks:
                await event(payload)
            await event("[DONE]")
            await resp.write_eof()
            return resp
        await self._sleep(request, plan.first_delay)
        for i, token in enumerate(plan.tokens):
            if plan.reset_after == i:
                await asyncio.sleep(0.05)  # scenario, kept: the tokens so far must reach the client:
                assert request.transport is not None  # abort() drops unsent buffered bytes
                request.transport.abort()
                return resp
            if i:
                await self._sleep(request, plan.gap)
            await event(chunk(token))
        await event(chunk(None, "stop"))
        if plan.usage:
            await event(
                {
                    "id": "cmpl-1",
                    "created": 1,
                    "model": "up",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 11,
                        "completion_tokens": len(plan.tokens),
                        "total_tokens": 11 + len(plan.tokens),
                    },
                }
            )
        await event("[DONE]")
        await resp.write_eof()
        return resp

    async def _sleep(self, request: web.Request, seconds: float) -> None:
        # aiohttp no longer cancels a handler when its client goes away: poll the transport.
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if request.transport is None or request.transport.is_closing():
                raise Disconnected
            await asyncio.sleep(0.005)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    app.router.add_post("/v1/completions", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.url = f"http://{host}:{port}/v1"
    yield fake
    await runner.cleanup()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


EngineFactory = Callable[..., Awaitable[OpenAIUpstreamEngine]]


@pytest.fixture
async def make_engine(upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EngineFactory]:
    monkeypatch.setenv(KEY_ENV, KEY)
    engines: list[OpenAIUpstreamEngine] = []

    async def make(**overrides: Any) -> OpenAIUpstreamEngine:
        engine_kwargs = {k: overrides.pop(k) for k in ("clock", "on_breaker_change") if k in overrides}
        config = OpenAIUpstreamConfig(
            base_url=upstream.url,
            model="up-model",
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
        engine = OpenAIUpstreamEngine(replace(config, **overrides), **engine_kwargs)
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.cleanup()


def request(
    rid: str = "r1",
    text: str = "What is the capital of France?",
    *,
    extra: bytes = b"",
    confidence: bool = False,
    **fields: Any,
) -> EngineRequest:
    body = ChatBody(model="client-model", messages=[Message(role="user", content=text)], **fields)
    return EngineRequest(request_id=rid, body=body, extra=extra, klass="chat", confidence=confidence)


def chunk(*choices: dict[str, Any], usage: dict[str, int] | None = None) -> dict[str, Any]:
    """An OpenAI `chat.completion.chunk` with these choices."""
    out: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up",
        "choices": list(choices),
    }
    if usage is not None:
        out["usage"] = usage
    return out


async def collect(
    engine: OpenAIUpstreamEngine, req: EngineRequest, into: list[EngineOutput] | None = None
) -> list[EngineOutput]:
    outputs = into if into is not None else []
    async for out in engine.generate(req):
        outputs.append(out)
    return outputs


def text_of(outputs: list[EngineOutput]) -> str:
    return "".join(o.text for o in outputs)


# -- the happy path ------------------------------------------------------------------------------


async def test_streams_tokens_with_upstream_usage(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    req = request(max_tokens=20, temperature=0.3, top_p=0.9, stop=["\n\n"], seed=7, stream=False)
    outputs = await collect(engine, req)

    assert [o.text for o in outputs[:-1]] == ["Hello", ",", " world"]
    final = outputs[-1]
    assert (final.finish_reason, final.prompt_tokens, final.completion_tokens) == ("stop", 11, 3)
    assert all(o.finish_reason is None for o in outputs[:-1])
    (seen,) = upstream.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.body == {
        "model": "up-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 20,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "seed": 7,
    }
    assert engine.capacity().free_slots == 4


async def test_counts_streamed_tokens_without_a_usage_chunk(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(usage=False, tokens=("a", "b", "c", "d")))
    engine = await make_engine()
    final = (await collect(engine, request()))[-1]
    assert final.completion_tokens == 4
    assert final.prompt_tokens > 0


async def test_upstream_prefix_cache_hits_are_relayed(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    """OpenAI's `usage.prompt_tokens_details.cached_tokens` reaches the final output; a null or
    absent detail (vLLM without prompt-token details, other upstreams) is 0."""

    def usage(details: Any) -> dict[str, Any]:
        return {"prompt_tokens": 2048, "completion_tokens": 1, "total_tokens": 2049, "prompt_tokens_details": details}

    engine = await make_engine()
    for details, hits in (({"cached_tokens": 1920, "audio_tokens": 0}, 1920), ({"cached_tokens": None}, 0), (None, 0)):
        upstream.script(
            Plan(
                chunks=(
                    chunk({"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}),
                    chunk(usage=usage(details)),
                )
            )
        )
        final = (await collect(engine, request()))[-1]
        assert (final.prompt_tokens, final.cached_tokens) == (2048, hits)


async def test_completion_bodies_use_the_completions_endpoint(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    engine = await make_engine()
    body = CompletionBody(model="client-model", prompt="Once upon", echo=False, suffix="The end.", best_of=2)
    outputs = await collect(engine, EngineRequest(request_id="p1", body=body, extra=b'{"min_p":0.1}'))
    assert text_of(outputs) == "Hello, world"
    assert upstream.seen[0].path == "/v1/completions"
    assert upstream.seen[0].body == {
        "model": "up-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": "Once upon",
        "max_tokens": 16,
        "echo": False,
        "suffix": "The end.",
        "best_of": 2,
        "min_p": 0.1,
    }


# -- the body passes through; every choice's pieces come back ------------------------------------


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather by city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "strict": True,
        },
    }
]


async def test_the_client_body_reaches_the_upstream_verbatim(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    client = {
        "model": "client-model",
        "messages": history,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
        "logprobs": True,
        "top_logprobs": 2,
        "n": 2,
        "temperature": 0.0,
        "max_completion_tokens": 50,
    }
    # The extra fields as the edge keeps them: raw bytes, spelling included (1.10, not 1.1).
    extra = b'{"top_k":40,"repetition_penalty":1.10,"guided_choice":["a","b"],"cache_salt":"client-chosen"}'
    body = msgspec.convert(client, ChatBody)
    engine = await make_engine()
    await collect(engine, EngineRequest(request_id="v1", body=body, extra=extra))
    (seen,) = upstream.seen
    expected = {
        **client,
        "model": "up-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 40,
        "repetition_penalty": 1.1,
        "guided_choice": ["a", "b"],
    }
    assert seen.body == expected  # cache_salt is not the client's to set
    assert b'"repetition_penalty":1.10' in seen.raw  # spliced, never re-parsed


async def test_tool_call_pieces_are_relayed_exactly(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    def calls(*pieces: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return chunk({"index": 0, "delta": {"tool_calls": list(pieces)}, "finish_reason": finish})

    upstream.script(
        Plan(
            chunks=(
                chunk({"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}),
                calls(
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ),
                calls({"index": 0, "function": {"arguments": '{"ci'}}),
                calls(
                    {"index": 0, "function": {"arguments": 'ty": "Paris"}'}},
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    },
                ),
                chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
                chunk(usage={"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}),
            )
        )
    )
    engine = await make_engine()
    outputs = await collect(engine, request(tools=msgspec.convert(TOOLS, list[Tool]), tool_choice="auto"))
    assert [d for o in outputs for d in o.tool_calls] == [
        ToolCallDelta(0, "call_a", "get_weather", ""),
        ToolCallDelta(0, "", "", '{"ci'),
        ToolCallDelta(0, "", "", 'ty": "Paris"}'),
        ToolCallDelta(1, "call_b", "get_time", "{}"),
    ]
    assert [len(o.tool_calls) for o in outputs[:-1]] == [1, 1, 2]  # one output per upstream delta
    assert (outputs[-1].finish_reason, outputs[-1].completion_tokens) == ("tool_calls", 12)


async def test_n_choices_keep_their_indices_and_finish_reasons(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    def piece(index: int, text: str | None, finish: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": {"content": text} if text is not None else {}, "finish_reason": finish}

    upstream.script(
        Plan(
            chunks=(
                chunk(piece(1, "Bonjour")),
                chunk(piece(0, "Hello")),
                chunk(piece(0, " there"), piece(1, None, "length")),
                chunk(piece(0, None, "stop")),
                chunk(usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
            )
        )
    )
    engine = await make_engine()
    outputs = await collect(engine, request(n=2))
    assert [(o.index, o.text) for o in outputs[:-1]] == [(1, "Bonjour"), (0, "Hello"), (0, " there")]
    final = outputs[-1]
    assert (final.finish_reason, final.finish_reasons) == ("stop", ["stop", "length"])
    assert upstream.seen[0].body["n"] == 2


async def test_refusal_reasoning_and_content_filter_are_relayed(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    upstream.script(
        Plan(
            chunks=(
                chunk({"index": 0, "delta": {"reasoning_content": "Thinking."}, "finish_reason": None}),
                chunk({"index": 0, "delta": {"reasoning": " Still."}, "finish_reason": None}),
                chunk({"index": 0, "delta": {"refusal": "I can't help with that."}, "finish_reason": "content_filter"}),
            )
        )
    )
    engine = await make_engine()
    outputs = await collect(engine, request())
    assert [(o.reasoning, o.refusal) for o in outputs[:-1]] == [
        ("Thinking.", ""),
        (" Still.", ""),
        ("", "I can't help with that."),
    ]
    assert outputs[-1].finish_reason == "content_filter"


def logprob_chunk(token: str, logprob: float, tops: list[tuple[str, float]]) -> dict[str, Any]:
    entry = {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in tops],
    }
    return chunk(
        {
            "index": 0,
            "delta": {"content": token},
            "logprobs": {"content": [entry], "refusal": None},
            "finish_reason": None,
        }
    )


LOGPROB_CHUNKS = (
    logprob_chunk("Hi", -0.25, [("Hi", -0.25), ("Hey", -1.5)]),
    logprob_chunk("!", -0.5, [("!", -0.5), (".", -1.0)]),
    chunk({"index": 0, "delta": {}, "finish_reason": "stop"}),
)


async def test_logprobs_are_relayed(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(chunks=LOGPROB_CHUNKS))
    engine = await make_engine()
    outputs = await collect(engine, request(logprobs=True, top_logprobs=2, confidence=True))
    assert [o.logprobs for o in outputs[:-1]] == [
        [
            TokenLogprob(
                "Hi", -0.25, [72, 105], [TopLogprob("Hi", -0.25, [72, 105]), TopLogprob("Hey", -1.5, [72, 101, 121])]
            )
        ],
        [TokenLogprob("!", -0.5, [33], [TopLogprob("!", -0.5, [33]), TopLogprob(".", -1.0, [46])])],
    ]
    assert [o.confidence for o in outputs[:-1]] == [[-0.25], [-0.5]]
    assert (upstream.seen[0].body["logprobs"], upstream.seen[0].body["top_logprobs"]) == (True, 2)


async def test_confidence_alone_asks_for_logprobs_but_returns_none(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    upstream.script(Plan(chunks=LOGPROB_CHUNKS))
    engine = await make_engine()
    assert engine.supports_logprobs
    outputs = await collect(engine, request(confidence=True))
    assert upstream.seen[0].body["logprobs"] is True and "top_logprobs" not in upstream.seen[0].body
    assert [o.confidence for o in outputs[:-1]] == [[-0.25], [-0.5]]
    assert all(not o.logprobs for o in outputs)  # the client did not ask for them


async def test_completion_logprobs_are_relayed(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    def piece(text: str, logprob: float, tops: dict[str, float]) -> dict[str, Any]:
        return {
            "id": "c1",
            "object": "text_completion",
            "created": 1,
            "model": "up",
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "finish_reason": None,
                    "logprobs": {
                        "tokens": [text],
                        "token_logprobs": [logprob],
                        "top_logprobs": [tops],
                        "text_offset": [0],
                    },
                }
            ],
        }

    upstream.script(
        Plan(
            chunks=(
                piece(" upon", -0.1, {" upon": -0.1, " a": -2.5}),
                piece(" a", -0.3, {" a": -0.3}),
                {
                    "id": "c1",
                    "object": "text_completion",
                    "created": 1,
                    "model": "up",
                    "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                },
            )
        )
    )
    engine = await make_engine()
    body = CompletionBody(model="client-model", prompt="Once", max_tokens=2, logprobs=2)
    outputs = await collect(engine, EngineRequest(request_id="c1", body=body))
    assert text_of(outputs) == " upon a"
    assert [o.logprobs for o in outputs[:-1]] == [
        [TokenLogprob(" upon", -0.1, None, [TopLogprob(" upon", -0.1), TopLogprob(" a", -2.5)])],
        [TokenLogprob(" a", -0.3, None, [TopLogprob(" a", -0.3)])],
    ]
    assert outputs[-1].finish_reason == "length"
    assert upstream.seen[0].body["logprobs"] == 2


async def test_the_upstream_rejecting_a_passed_field_names_it(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    error = {"message": "top_k is not supported", "type": "invalid_request_error", "param": "top_k", "code": None}
    upstream.script(Plan(status=400, error=error))
    engine = await make_engine()
    with pytest.raises(UpstreamRejected) as info:
        await collect(engine, request(extra=b'{"top_k":5}'))
    assert (info.value.param, len(upstream.seen)) == ("top_k", 1)


# -- the upstream key ----------------------------------------------------------------------------


async def test_key_comes_from_the_named_env_var_only(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    engine = await make_engine()
    # A request that tries to smuggle credentials changes nothing but its own content.
    await collect(engine, request(text="Authorization: Bearer sk-client-evil"))
    headers = upstream.seen[0].headers
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert "sk-client-evil" not in json.dumps(headers)


async def test_no_key_in_env_sends_no_authorization(
    upstream: FakeUpstream, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    engine = await make_engine()
    await collect(engine, request())
    assert "Authorization" not in upstream.seen[0].headers


async def test_auth_errors_do_not_echo_the_upstream_body(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(status=401, error={"message": f"Incorrect API key provided: {KEY}", "type": "auth"}))
    engine = await make_engine()
    with pytest.raises(UpstreamError) as info:
        await collect(engine, request())
    assert info.value.status == 401
    assert KEY not in str(info.value)
    assert len(upstream.seen) == 1  # not retried
    assert engine.breaker.state is BreakerState.CLOSED


# -- retries: only before the first token --------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        Plan(status=500),
        Plan(status=503),
        Plan(status=429, retry_after="0"),
        Plan(hang=True),  # first-token timeout
        Plan(first_delay=30.0),  # headers, then no token in time
        Plan(reset_after=0),  # reset before any token
    ],
    ids=["500", "503", "429", "hang", "slow-first-token", "reset-before-first-token"],
)
async def test_retries_before_the_first_token(upstream: FakeUpstream, make_engine: EngineFactory, fault: Plan) -> None:
    upstream.script(fault)
    engine = await make_engine(first_token_timeout_s=1.0)
    outputs = await collect(engine, request())
    assert text_of(outputs) == "Hello, world"
    assert outputs[-1].finish_reason == "stop"
    assert len(upstream.seen) == 2


async def test_gives_up_after_the_configured_retries(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(*[Plan(status=502)] * 5)
    engine = await make_engine(retries=2)
    with pytest.raises(UpstreamError) as info:
        await collect(engine, request())
    assert info.value.status == 502 and not info.value.partial
    assert len(upstream.seen) == 3


async def test_a_long_retry_after_fails_now_instead_of_holding_the_slot(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    upstream.script(Plan(status=429, retry_after="30"))
    engine = await make_engine()
    started = time.monotonic()
    with pytest.raises(UpstreamError) as info:
        await collect(engine, request())
    assert (info.value.status, info.value.retry_after_s) == (429, 30.0)
    assert info.value.counts_against_breaker
    assert time.monotonic() - started < 1.0 and len(upstream.seen) == 1


async def test_no_retry_after_the_first_token(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(tokens=("one", " two", " three", " four"), reset_after=2))
    engine = await make_engine()
    outputs: list[EngineOutput] = []
    with pytest.raises(UpstreamError) as info:
        await collect(engine, request(), outputs)
    assert text_of(outputs) == "one two"  # the partial output came first ...
    assert info.value.partial  # ... and the error says so
    assert len(upstream.seen) == 1


# -- timeouts ------------------------------------------------------------------------------------


async def test_first_token_timeout(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(hang=True))
    engine = await make_engine(retries=0, first_token_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout) as info:
        await collect(engine, request())
    assert info.value.phase == "first_token"
    assert time.monotonic() - started < 2.0
    await asyncio.wait_for(upstream.disconnected.wait(), 2.0)  # the hung request was dropped


async def test_idle_timeout_between_tokens(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(tokens=("a", "b"), gap=1.0))
    engine = await make_engine(idle_timeout_s=0.2)
    outputs: list[EngineOutput] = []
    with pytest.raises(UpstreamTimeout) as info:
        await collect(engine, request(), outputs)
    assert info.value.phase == "idle" and info.value.partial
    assert text_of(outputs) == "a"
    assert len(upstream.seen) == 1


async def test_total_timeout_on_a_slow_stream(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    # Every gap is within the idle timeout, but the stream as a whole takes too long.
    upstream.script(Plan(tokens=tuple("abcdefghij"), gap=0.3))
    engine = await make_engine(idle_timeout_s=2.0, total_timeout_s=1.5)
    outputs: list[EngineOutput] = []
    with pytest.raises(UpstreamTimeout) as info:
        await collect(engine, request(), outputs)
    assert info.value.phase == "total"
    assert 0 < len(outputs) < 10


async def test_connect_failure_counts_as_an_upstream_fault(make_engine: EngineFactory) -> None:
    port = free_port()  # nothing listens there
    engine = await make_engine(base_url=f"http://127.0.0.1:{port}/v1", retries=0)
    with pytest.raises(UpstreamError) as info:
        await collect(engine, request())
    assert info.value.counts_against_breaker and info.value.status is None


# -- request errors ------------------------------------------------------------------------------


async def test_400_is_the_requests_fault(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    error = {
        "message": "This model's maximum context length is 10 tokens",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    upstream.script(*[Plan(status=400, error=error)] * 5)
    engine = await make_engine()
    for i in range(5):  # more than the breaker's threshold
        with pytest.raises(UpstreamRejected) as info:
            await collect(engine, request(f"r{i}"))
        assert (info.value.status, info.value.param) == (400, "messages")
        assert "maximum context length" in info.value.message
    assert len(upstream.seen) == 5  # never retried
    assert engine.breaker.state is BreakerState.CLOSED


# -- the circuit breaker -------------------------------------------------------------------------


async def test_breaker_opens_rejects_fast_and_a_probe_closes_it(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    clock = FakeClock()
    changes: list[tuple[BreakerState, BreakerState]] = []
    engine = await make_engine(
        retries=0,
        clock=clock,
        on_breaker_change=lambda o, n: changes.append((o, n)),
        breaker=BreakerConfig(failure_threshold=3, min_volume=100, cooldown_s=5.0),
    )
    upstream.script(Plan(status=500), Plan(status=429), Plan(reset_after=0))
    for i in range(3):
        with pytest.raises(UpstreamError):
            await collect(engine, request(f"f{i}"))
    assert engine.breaker.state is BreakerState.OPEN
    assert engine.capacity().free_slots == 0  # the worker stops pulling

    with pytest.raises(CircuitOpen) as info:
        await collect(engine, request("rejected"))
    assert info.value.retry_after_s == pytest.approx(5.0)
    assert len(upstream.seen) == 3  # rejected without touching the upstream

    clock.now += 5.0
    assert engine.capacity().free_slots == 1  # one probe
    outputs = await collect(engine, request("probe"))
    assert outputs[-1].finish_reason == "stop"
    assert engine.breaker.state is BreakerState.CLOSED
    assert engine.capacity().free_slots == 4
    assert changes == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
    ]


async def test_failed_probe_reopens(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    clock = FakeClock()
    engine = await make_engine(
        retries=0, clock=clock, breaker=BreakerConfig(failure_threshold=1, min_volume=100, cooldown_s=5.0)
    )
    upstream.script(Plan(status=500), Plan(status=500))
    with pytest.raises(UpstreamError):
        await collect(engine, request("a"))
    clock.now += 5.0
    with pytest.raises(UpstreamError):
        await collect(engine, request("probe"))
    assert engine.breaker.state is BreakerState.OPEN


async def test_breaker_opening_between_attempts_stops_the_retries(
    upstream: FakeUpstream, make_engine: EngineFactory
) -> None:
    upstream.script(*[Plan(status=500)] * 5)
    engine = await make_engine(retries=4, breaker=BreakerConfig(failure_threshold=2, min_volume=100))
    with pytest.raises(CircuitOpen):
        await collect(engine, request())
    assert len(upstream.seen) == 2


# -- abort and early close -----------------------------------------------------------------------


async def test_abort_while_the_upstream_hangs(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(hang=True))
    engine = await make_engine(first_token_timeout_s=10.0)
    task = asyncio.create_task(collect(engine, request("hung")))
    assert await eventually(lambda: upstream.seen)
    await engine.abort(RequestKey("", "hung"))
    outputs = await asyncio.wait_for(task, 2.0)
    assert [o.finish_reason for o in outputs] == ["abort"]
    await asyncio.wait_for(upstream.disconnected.wait(), 2.0)


async def test_closing_the_iterator_is_no_upstream_fault(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    """That it aborts the request is the conformance suite's (tests/conformance); that the
    breaker does not count it against the upstream is this engine's own."""
    upstream.script(*[Plan(tokens=tuple("abcdefghijklmnop"), gap=0.05)] * 3)
    engine = await make_engine(breaker=BreakerConfig(failure_threshold=1, min_volume=100, cooldown_s=5.0))
    for _ in range(3):
        stream = engine.generate(request())
        assert (await anext(stream)).text == "a"
        await stream.aclose()
    await asyncio.wait_for(upstream.disconnected.wait(), 2.0)
    assert engine.breaker.state is BreakerState.CLOSED


async def test_cancelling_the_consumer_propagates(upstream: FakeUpstream, make_engine: EngineFactory) -> None:
    upstream.script(Plan(hang=True))
    engine = await make_engine(first_token_timeout_s=10.0)
    task = asyncio.create_task(collect(engine, request()))
    assert await eventually(lambda: upstream.seen)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(upstream.disconnected.wait(), 2.0)
    assert engine.capacity().free_slots == 4


# -- config --------------------------------------------------------------------------------------


def test_config_from_cli_flags() -> None:
    parser = argparse.ArgumentParser()
    OpenAIUpstreamConfig.configure(parser)
    args = parser.parse_args(
        [
            "--upstream-url",
            "https://api.example.com/v1/",
            "--upstream-model",
            "gpt-x",
            "--upstream-key-env",
            "MY_KEY",
            "--upstream-max-concurrency",
            "16",
            "--upstream-first-token-timeout",
            "2.5",
            "--upstream-retries",
            "1",
            "--upstream-breaker-failures",
            "7",
            "--upstream-breaker-cooldown",
            "3",
        ]
    )
    config = OpenAIUpstreamConfig.from_args(args)
    assert (config.base_url, config.model, config.api_key_env) == ("https://api.example.com/v1", "gpt-x", "MY_KEY")
    assert (config.max_concurrency, config.first_token_timeout_s, config.retries) == (16, 2.5, 1)
    assert (config.breaker.failure_threshold, config.breaker.cooldown_s) == (7, 3.0)
    assert config.total_timeout_s == OpenAIUpstreamConfig.__dataclass_fields__["total_timeout_s"].default
    with pytest.raises(ValueError, match="--upstream-url"):
        OpenAIUpstreamConfig.from_args(parser.parse_args([]))
