"""Conformance with OpenAI's own API description (`tests/openapi/`), end to end: bridge + broker +
sim worker on a real nats-server, spoken to over plain HTTP.

Every property of CreateChatCompletionRequest and CreateCompletionRequest (allOf parts included)
has an entry in CHAT or COMPLETION saying how Laneway, on the simulated engine, treats it:

- HONOURED: a small request shows its effect (usage, choices, cuts, shapes), not the words;
- ACCEPTED: taken and answered (200); it describes the request or shapes a sampler the
  simulation does not have, so there is no effect to show;
- REFUSED: a 400 whose `error.param` names it.

A spec property with no entry fails `test_every_spec_property_has_an_entry`, so a newer spec's
fields are noticed. Every request sent validates against the spec's request schema, every
response and every streamed chunk against its response schema, every error against ErrorResponse.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import pytest

from loadtest.stack import Stack, demo_settings
from tests.openapi import properties, validate

KEY = "sk-test-conformance-key"
MODEL = "laneway-sim"
ASK = [{"role": "user", "content": "Where is my order AB123456?"}]

ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order by its number",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{6}$"},
                "include_items": {"type": "boolean"},
            },
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
TICKET_TOOL = {
    "type": "function",
    "function": {
        "name": "open_ticket",
        "parameters": {
            "type": "object",
            "properties": {
                "priority": {"enum": ["low", "normal", "urgent"]},
                "summary": {"type": "string", "minLength": 5},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
            "required": ["priority", "summary", "tags"],
        },
    },
}
TOOLS = [ORDER_TOOL, TICKET_TOOL]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "number": {"type": "string"},
        "total": {"type": "number", "minimum": 0},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["number", "total", "lines"],
    "additionalProperties": False,
}


# -- the stack and a spec-checking client ------------------------------------------------------
@pytest.fixture(scope="module")
async def stack(nats_server):
    # No response cache: a repeated seeded answer must be the engine's, not a stored copy.
    async with Stack(nats_server.url, demo_settings(KEY), cache_ttl_s=0) as s:
        yield s


class Api:
    """Plain HTTP to the bridge; every body sent and received is checked against the spec."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def _post(self, path: str, request_schema: str, body: dict[str, Any]) -> httpx.Response:
        validate(request_schema, body)  # the test itself speaks the spec
        return await self.http.post(path, json=body)

    async def _ok(self, path: str, request_schema: str, response_schema: str, fields: dict[str, Any]) -> dict[str, Any]:
        response = await self._post(path, request_schema, fields)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        validate(response_schema, body)
        return body

    async def _stream(
        self, path: str, request_schema: str, chunk_schema: str, fields: dict[str, Any]
    ) -> list[dict[str, Any]]:
        validate(request_schema, {**fields, "stream": True})
        chunks: list[dict[str, Any]] = []
        done = False
        async with self.http.stream("POST", path, json={**fields, "stream": True}) as response:
            assert response.status_code == 200, (await response.aread()).decode()
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    # An `id:` names the event for a resume (docs/openai-api.md, "Resuming a stream").
                    assert not line.strip() or line.startswith((":", "id: ")), f"not SSE: {line!r}"
                    continue
                data = line[len("data:") :].strip()
                assert not done, "data after [DONE]"
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                assert "error" not in chunk, chunk
                validate(chunk_schema, chunk)
                chunks.append(chunk)
        assert done, "the stream did not end with data: [DONE]"
        assert len({c["id"] for c in chunks}) == 1, "chunks of one stream share one id"
        return chunks

    async def _refused(self, path: str, request_schema: str, fields: dict[str, Any]) -> dict[str, Any]:
        response = await self._post(path, request_schema, fields)
        assert response.status_code == 400, f"{response.status_code}: {response.text}"
        body = response.json()
        validate("ErrorResponse", body)
        return body["error"]

    def chat(self, **fields: Any) -> Awaitable[dict[str, Any]]:
        return self._ok(
            "/v1/chat/completions", "CreateChatCompletionRequest", "CreateChatCompletionResponse", _chat_body(fields)
        )

    def chat_stream(self, **fields: Any) -> Awaitable[list[dict[str, Any]]]:
        return self._stream(
            "/v1/chat/completions",
            "CreateChatCompletionRequest",
            "CreateChatCompletionStreamResponse",
            _chat_body(fields),
        )

    def chat_refused(self, **fields: Any) -> Awaitable[dict[str, Any]]:
        return self._refused("/v1/chat/completions", "CreateChatCompletionRequest", _chat_body(fields))

    def complete(self, **fields: Any) -> Awaitable[dict[str, Any]]:
        return self._ok(
            "/v1/completions", "CreateCompletionRequest", "CreateCompletionResponse", _completion_body(fields)
        )

    def complete_stream(self, **fields: Any) -> Awaitable[list[dict[str, Any]]]:
        # CreateCompletionResponse with `finish_reason: null` allowed: see tests/openapi/__init__.py.
        return self._stream(
            "/v1/completions", "CreateCompletionRequest", "CreateCompletionStreamResponse", _completion_body(fields)
        )

    def complete_refused(self, **fields: Any) -> Awaitable[dict[str, Any]]:
        return self._refused("/v1/completions", "CreateCompletionRequest", _completion_body(fields))


def _chat_body(fields: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, **fields}


def _completion_body(fields: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


@pytest.fixture
async def api(stack):
    async with httpx.AsyncClient(base_url=stack.url, timeout=30.0, headers={"Authorization": f"Bearer {KEY}"}) as http:
        yield Api(http)


def _content(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if c["choices"] and c["choices"][0]["index"] == index
    )


def _finishes(chunks: list[dict[str, Any]]) -> dict[int, str]:
    return {ch["index"]: ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]}


def _calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    return body["choices"][0]["message"].get("tool_calls") or []


def _valid_call(call: dict[str, Any]) -> None:
    assert call["type"] == "function" and call["id"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_SCHEMAS[call["function"]["name"]])


# -- the tables ------------------------------------------------------------------------------------
Check = Callable[[Api], Awaitable[None]]


@dataclass(frozen=True)
class Entry:
    kind: str  # HONOURED | ACCEPTED | REFUSED
    value: Any = None  # ACCEPTED / REFUSED: a spec-valid value to send
    check: Check | None = None  # HONOURED: shows the effect
    note: str = ""


HONOURED, ACCEPTED, REFUSED = "honoured", "accepted", "refused"
CHAT: dict[str, Entry] = {}
COMPLETION: dict[str, Entry] = {}


def honoured(table: dict[str, Entry], name: str, note: str = "") -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        assert name not in table, name
        table[name] = Entry(HONOURED, check=check, note=note)
        return check

    return register


# ---- chat: honoured
@honoured(CHAT, "messages")
async def _(api: Api) -> None:
    short = await api.chat(max_tokens=1)
    longer = await api.chat(
        max_tokens=1,
        messages=[
            {"role": "developer", "content": "Answer as a courier would, briefly and precisely."},
            {"role": "system", "content": [{"type": "text", "text": "Orders ship from Rotterdam."}]},
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "AB123456"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
            {"role": "user", "content": [{"type": "text", "text": "And when does it arrive?"}]},
        ],
    )
    assert longer["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"]


@honoured(CHAT, "model")
async def _(api: Api) -> None:
    assert (await api.chat(max_tokens=1))["model"] == MODEL
    response = await api.http.post("/v1/chat/completions", json=_chat_body({"model": "no-such-model"}))
    assert response.status_code == 404
    validate("ErrorResponse", response.json())
    assert response.json()["error"]["param"] == "model"


async def _limits(api: Api, field: str) -> None:
    body = await api.chat(**{field: 3})
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3


honoured(CHAT, "max_tokens")(lambda api: _limits(api, "max_tokens"))
honoured(CHAT, "max_completion_tokens")(lambda api: _limits(api, "max_completion_tokens"))


@honoured(CHAT, "n", note="n <= 8 (each choice holds a sequence slot); more is refused by name")
async def _(api: Api) -> None:
    body = await api.chat(n=3, max_tokens=2)
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 6
    chunks = await api.chat_stream(n=2, max_tokens=2)
    assert set(_finishes(chunks)) == {0, 1}
    assert (await api.chat_refused(n=9))["param"] == "n"


@honoured(CHAT, "stop")
async def _(api: Api) -> None:
    plain = (await api.chat(max_tokens=12, seed=11))["choices"][0]["message"]["content"]
    stop = plain[len(plain) // 2 : len(plain) // 2 + 3]
    for value in (stop, [stop, "\u2603never\u2603"]):
        cut = (await api.chat(max_tokens=12, seed=11, stop=value))["choices"][0]
        assert cut["finish_reason"] == "stop"
        assert cut["message"]["content"] == plain[: plain.index(stop)]
    streamed = await api.chat_stream(max_tokens=12, seed=11, stop=stop)
    assert _content(streamed) == plain[: plain.index(stop)] and _finishes(streamed) == {0: "stop"}


@honoured(CHAT, "logprobs")
async def _(api: Api) -> None:
    body = await api.chat(max_tokens=4, logprobs=True)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(t["logprob"] <= 0 for t in content)
    assert "".join(t["token"] for t in content) == body["choices"][0]["message"]["content"]
    assert (await api.chat(max_tokens=2, logprobs=False))["choices"][0]["logprobs"] is None
    chunks = await api.chat_stream(max_tokens=4, logprobs=True)
    assert (
        sum(
            len(c["choices"][0]["logprobs"]["content"])
            for c in chunks
            if c["choices"] and c["choices"][0].get("logprobs")
        )
        == 4
    )


@honoured(CHAT, "top_logprobs")
async def _(api: Api) -> None:
    body = await api.chat(max_tokens=4, logprobs=True, top_logprobs=3)
    for token in body["choices"][0]["logprobs"]["content"]:
        tops = [t["logprob"] for t in token["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] >= token["logprob"]
    assert (await api.chat_refused(top_logprobs=2))["param"] == "top_logprobs"  # needs logprobs


@honoured(CHAT, "temperature", note="0 is greedy: the same answer every time")
async def _(api: Api) -> None:
    first, second = [
        (await api.chat(max_tokens=10, temperature=0))["choices"][0]["message"]["content"] for _ in range(2)
    ]
    assert first == second


@honoured(CHAT, "seed")
async def _(api: Api) -> None:
    answers = [(await api.chat(max_tokens=16, seed=seed))["choices"][0]["message"]["content"] for seed in (7, 7, 8)]
    assert answers[0] == answers[1]
    assert answers[0] != answers[2]


@honoured(CHAT, "stream")
async def _(api: Api) -> None:
    whole = await api.chat(max_tokens=8, seed=3)
    chunks = await api.chat_stream(max_tokens=8, seed=3)
    assert len(chunks) >= 2 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert _content(chunks) == whole["choices"][0]["message"]["content"]
    assert _finishes(chunks) == {0: "length"}
    assert all(c.get("usage") is None for c in chunks)  # no include_usage: no usage chunk


@honoured(CHAT, "stream_options", note="include_usage: a last chunk with usage and no choices")
async def _(api: Api) -> None:
    chunks = await api.chat_stream(max_tokens=5, stream_options={"include_usage": True})
    usage = [c for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0] is chunks[-1] and usage[0]["choices"] == []
    assert usage[0]["usage"]["completion_tokens"] == 5
    chunks = await api.chat_stream(max_tokens=5, stream_options={"include_usage": False})
    assert not any(c.get("usage") for c in chunks)


@honoured(CHAT, "tools")
async def _(api: Api) -> None:
    body = await api.chat(tools=TOOLS, tool_choice="required")
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert _calls(body)
    for call in _calls(body):
        _valid_call(call)
    chunks = await api.chat_stream(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    pieces = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert pieces and pieces[0]["id"] and pieces[0]["function"]["name"]
    _valid_call(
        {
            "id": pieces[0]["id"],
            "type": "function",
            "function": {
                "name": pieces[0]["function"]["name"],
                "arguments": "".join(p["function"].get("arguments") or "" for p in pieces),
            },
        }
    )
    assert _finishes(chunks) == {0: "tool_calls"}


@honoured(CHAT, "tool_choice")
async def _(api: Api) -> None:
    none = await api.chat(tools=TOOLS, tool_choice="none", max_tokens=4)
    assert not _calls(none) and none["choices"][0]["message"]["content"]
    named = await api.chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "open_ticket"}})
    assert [c["function"]["name"] for c in _calls(named)] == ["open_ticket"]
    _valid_call(_calls(named)[0])
    auto = await api.chat(tools=TOOLS, tool_choice="auto", max_tokens=64)
    assert auto["choices"][0]["finish_reason"] in ("tool_calls", "stop", "length")
    refused = await api.chat_refused(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "refund"}})
    assert refused["param"] == "tool_choice"


@honoured(CHAT, "parallel_tool_calls", note="false: one call at most")
async def _(api: Api) -> None:
    for seed in range(3):
        body = await api.chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed)
        assert len(_calls(body)) == 1


@honoured(CHAT, "response_format", note="text, json_object, json_schema (the schema is kept)")
async def _(api: Api) -> None:
    text = await api.chat(max_tokens=4, response_format={"type": "text"})
    assert text["choices"][0]["message"]["content"]
    obj = await api.chat(response_format={"type": "json_object"})
    assert isinstance(json.loads(obj["choices"][0]["message"]["content"]), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "invoice", "strict": True, "schema": INVOICE_SCHEMA}}
    body = await api.chat(response_format=fmt)
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), INVOICE_SCHEMA)
    streamed = await api.chat_stream(response_format=fmt)
    jsonschema.validate(json.loads(_content(streamed)), INVOICE_SCHEMA)


@honoured(CHAT, "modalities", note='["text"] only; audio is refused by name')
async def _(api: Api) -> None:
    assert (await api.chat(max_tokens=2, modalities=["text"]))["choices"][0]["message"]["content"]
    assert (await api.chat_refused(modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}))[
        "param"
    ] in ("modalities", "audio")


# ---- chat: accepted (no effect a simulation can show) and refused
CHAT.update(
    {
        "metadata": Entry(ACCEPTED, {"project": "conformance"}),
        "store": Entry(ACCEPTED, False),
        "user": Entry(ACCEPTED, "user-1234"),
        "safety_identifier": Entry(ACCEPTED, "safety-identifier-1234"),
        "prompt_cache_key": Entry(ACCEPTED, "prompt-cache-key-1234"),
        "service_tier": Entry(ACCEPTED, "auto"),
        "top_p": Entry(ACCEPTED, 0.9, note="a sampler knob; the simulation has no distribution to shape"),
        "frequency_penalty": Entry(ACCEPTED, 0.5, note="likewise"),
        "presence_penalty": Entry(ACCEPTED, 0.5, note="likewise"),
        "logit_bias": Entry(ACCEPTED, {"50256": -100}, note="likewise"),
        "reasoning_effort": Entry(REFUSED, "low", note="the simulated model is not a reasoning model"),
        "verbosity": Entry(REFUSED, "low"),
        "audio": Entry(REFUSED, {"voice": "alloy", "format": "wav"}, note="text only"),
        "web_search_options": Entry(REFUSED, {"search_context_size": "low"}),
        "prediction": Entry(REFUSED, {"type": "content", "content": "Your order ships today."}),
        "moderation": Entry(REFUSED, {"model": "omni-moderation-latest"}),
        "prompt_cache_options": Entry(REFUSED, {"ttl": "30m"}),
        "prompt_cache_retention": Entry(REFUSED, "24h", note="deprecated"),
        "functions": Entry(
            REFUSED,
            [{"name": "lookup_order", "parameters": ORDER_TOOL["function"]["parameters"]}],
            note="deprecated in favour of tools",
        ),
        "function_call": Entry(REFUSED, "auto", note="deprecated in favour of tool_choice"),
    }
)


# ---- completions: honoured
@honoured(COMPLETION, "model")
async def _(api: Api) -> None:
    assert (await api.complete(max_tokens=1))["model"] == MODEL


@honoured(COMPLETION, "prompt", note="a string or a one-element list")
async def _(api: Api) -> None:
    short = await api.complete(max_tokens=1, prompt="Hi")
    longer = await api.complete(max_tokens=1, prompt=["Once upon a time, in a land far away, there lived a broker"])
    assert longer["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"]


@honoured(COMPLETION, "max_tokens", note="default 16, as OpenAI's")
async def _(api: Api) -> None:
    body = await api.complete(max_tokens=3)
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"
    default = await api.complete()
    assert default["usage"]["completion_tokens"] <= 16


@honoured(COMPLETION, "n")
async def _(api: Api) -> None:
    body = await api.complete(n=3, max_tokens=2)
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 6


@honoured(COMPLETION, "best_of", note="best_of == n only (as vLLM V1); best_of > n is refused")
async def _(api: Api) -> None:
    body = await api.complete(n=2, best_of=2, max_tokens=2)
    assert len(body["choices"]) == 2
    assert (await api.complete_refused(n=1, best_of=3))["param"] == "best_of"


@honoured(COMPLETION, "echo")
async def _(api: Api) -> None:
    body = await api.complete(prompt="Once upon a time", echo=True, max_tokens=3)
    assert body["choices"][0]["text"].startswith("Once upon a time")
    assert len(body["choices"][0]["text"]) > len("Once upon a time")


@honoured(COMPLETION, "logprobs", note="the legacy shape: tokens, token_logprobs, top_logprobs, text_offset")
async def _(api: Api) -> None:
    body = await api.complete(max_tokens=4, logprobs=2)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 4
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"])
    assert (await api.complete(max_tokens=2))["choices"][0]["logprobs"] is None


@honoured(COMPLETION, "stop")
async def _(api: Api) -> None:
    plain = (await api.complete(max_tokens=12, seed=5))["choices"][0]["text"]
    stop = plain[len(plain) // 2 : len(plain) // 2 + 3]
    cut = (await api.complete(max_tokens=12, seed=5, stop=[stop]))["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == plain[: plain.index(stop)]


@honoured(COMPLETION, "seed")
async def _(api: Api) -> None:
    answers = [(await api.complete(max_tokens=16, seed=seed))["choices"][0]["text"] for seed in (7, 7, 8)]
    assert answers[0] == answers[1] and answers[0] != answers[2]


@honoured(COMPLETION, "temperature")
async def _(api: Api) -> None:
    first, second = [(await api.complete(max_tokens=10, temperature=0))["choices"][0]["text"] for _ in range(2)]
    assert first == second


@honoured(COMPLETION, "stream")
async def _(api: Api) -> None:
    whole = await api.complete(max_tokens=6, seed=9)
    chunks = await api.complete_stream(max_tokens=6, seed=9)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["choices"][0]["text"]
    assert _finishes(chunks) == {0: "length"}


@honoured(COMPLETION, "stream_options")
async def _(api: Api) -> None:
    chunks = await api.complete_stream(max_tokens=4, stream_options={"include_usage": True})
    usage = [c for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0] is chunks[-1] and usage[0]["choices"] == []
    assert usage[0]["usage"]["completion_tokens"] == 4


COMPLETION.update(
    {
        "suffix": Entry(
            ACCEPTED,
            " and they lived happily ever after.",
            note="any simulated text is as good an insertion as any other",
        ),
        "user": Entry(ACCEPTED, "user-1234"),
        "top_p": Entry(ACCEPTED, 0.9, note="a sampler knob; the simulation has no distribution to shape"),
        "frequency_penalty": Entry(ACCEPTED, 0.5, note="likewise"),
        "presence_penalty": Entry(ACCEPTED, 0.5, note="likewise"),
        "logit_bias": Entry(ACCEPTED, {"50256": -100}, note="likewise"),
    }
)

TABLES = {"CreateChatCompletionRequest": CHAT, "CreateCompletionRequest": COMPLETION}
OPS = {
    "CreateChatCompletionRequest": ("chat", "chat_refused"),
    "CreateCompletionRequest": ("complete", "complete_refused"),
}


# -- the tests -------------------------------------------------------------------------------------
def _spec_rows() -> list[tuple[str, str]]:
    return [(schema, name) for schema in TABLES for name in sorted(properties(schema))]


@pytest.mark.parametrize("schema", sorted(TABLES))
def test_every_spec_property_has_an_entry(schema):
    spec, table = set(properties(schema)), set(TABLES[schema])
    assert not spec - table, f"{schema} properties with no conformance entry: {sorted(spec - table)}"
    assert not table - spec, f"entries for properties {schema} does not have: {sorted(table - spec)}"


@pytest.mark.parametrize(("schema", "name"), _spec_rows(), ids=[f"{s[6:-7]}.{n}" for s, n in _spec_rows()])
async def test_property(api, schema, name):
    entry = TABLES[schema].get(name)
    assert entry is not None, f"{schema}.{name} has no conformance entry"
    ok, refused = (getattr(api, op) for op in OPS[schema])
    if entry.kind == HONOURED:
        await entry.check(api)
    elif entry.kind == ACCEPTED:
        body = await ok(max_tokens=2, **{name: entry.value})
        assert body["choices"] and body["usage"]["completion_tokens"] == 2
    else:
        assert entry.kind == REFUSED
        error = await refused(max_tokens=2, **{name: entry.value})
        assert error["param"] == name, error
        assert error["type"] == "invalid_request_error"


# -- the rest of the surface -----------------------------------------------------------------------
async def test_models_list_and_retrieve_match_the_spec(api):
    listed = await api.http.get("/v1/models")
    assert listed.status_code == 200
    validate("ListModelsResponse", listed.json())
    assert MODEL in [m["id"] for m in listed.json()["data"]]
    one = await api.http.get(f"/v1/models/{MODEL}")
    assert one.status_code == 200
    validate("Model", one.json())
    missing = await api.http.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    validate("ErrorResponse", missing.json())


async def test_errors_match_the_spec(api, stack):
    async with httpx.AsyncClient(base_url=stack.url, timeout=30.0) as anonymous:
        unauthorized = await anonymous.post("/v1/chat/completions", json=_chat_body({}))
    assert unauthorized.status_code == 401
    validate("ErrorResponse", unauthorized.json())
    not_json = await api.http.post(
        "/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400
    validate("ErrorResponse", not_json.json())
    wrong_role = await api.http.post(
        "/v1/chat/completions", json=_chat_body({"messages": [{"role": "robot", "content": "hi"}]})
    )
    assert wrong_role.status_code == 400
    validate("ErrorResponse", wrong_role.json())
    assert wrong_role.json()["error"]["param"].startswith("messages[0]")


async def test_unknown_fields_pass_through_to_the_engine(api):
    """Fields the spec lacks reach the engine verbatim: vLLM's top_k is honoured or accepted,
    a made-up one is refused by name."""
    response = await api.http.post("/v1/chat/completions", json=_chat_body({"max_tokens": 2, "top_k": 5}))
    assert response.status_code == 200
    validate("CreateChatCompletionResponse", response.json())
    response = await api.http.post("/v1/chat/completions", json=_chat_body({"max_tokens": 2, "frobnicate": 1}))
    assert response.status_code == 400
    validate("ErrorResponse", response.json())
    assert response.json()["error"]["param"] == "frobnicate"


def test_the_tables_say_something_for_every_entry():
    for table in TABLES.values():
        for name, entry in table.items():
            assert entry.kind in (HONOURED, ACCEPTED, REFUSED), name
            assert (entry.check is not None) == (entry.kind == HONOURED), name


JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE_SCHEMA}}
COMBINATIONS = {
    "n+logprobs+usage": {
        "n": 2,
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "stream_options": {"include_usage": True},
    },
    "n+tools": {"n": 2, "tools": TOOLS, "tool_choice": "required"},
    "n+json_schema": {"n": 2, "response_format": JSON_FORMAT, "seed": 4},
    "stop+logprobs": {"max_tokens": 12, "seed": 11, "stop": [" ", "."], "logprobs": True},
    "tools+logprobs": {"tools": TOOLS, "tool_choice": "required", "logprobs": True, "top_logprobs": 1},
}


@pytest.mark.parametrize("fields", list(COMBINATIONS.values()), ids=list(COMBINATIONS))
async def test_combinations_match_the_spec_streamed_and_not(api, fields):
    n = fields.get("n", 1)
    body = await api.chat(**{k: v for k, v in fields.items() if k != "stream_options"})
    assert sorted(c["index"] for c in body["choices"]) == list(range(n))
    chunks = await api.chat_stream(**fields)
    assert set(_finishes(chunks)) == set(range(n))
    for choice in body["choices"]:
        if "tools" in fields:
            assert choice["finish_reason"] == "tool_calls"
            for call in choice["message"]["tool_calls"]:
                _valid_call(call)
        if "response_format" in fields:
            jsonschema.validate(json.loads(choice["message"]["content"]), INVOICE_SCHEMA)
    for i in range(n):
        if "response_format" in fields:
            jsonschema.validate(json.loads(_content(chunks, i)), INVOICE_SCHEMA)
        if "tools" in fields:
            calls: dict[int, dict[str, Any]] = {}
            for c in chunks:
                for ch in c["choices"]:
                    for piece in ch["delta"].get("tool_calls") or [] if ch["index"] == i else []:
                        call = calls.setdefault(
                            piece["index"],
                            {"id": piece.get("id"), "type": "function", "function": {"name": "", "arguments": ""}},
                        )
                        call["function"]["name"] += piece.get("function", {}).get("name") or ""
                        call["function"]["arguments"] += piece.get("function", {}).get("arguments") or ""
            assert calls
            for call in calls.values():
                _valid_call(call)


async def test_text_completion_combinations_match_the_spec(api):
    for fields in (
        {"n": 2, "max_tokens": 3, "logprobs": 1, "stream_options": {"include_usage": True}},
        {"echo": True, "max_tokens": 3, "stop": "\n"},
    ):
        body = await api.complete(**{k: v for k, v in fields.items() if k != "stream_options"})
        assert len(body["choices"]) == fields.get("n", 1)
        chunks = await api.complete_stream(**fields)
        assert set(_finishes(chunks)) == set(range(fields.get("n", 1)))


def _nullable_rows() -> list[tuple[str, str]]:
    """Optional properties whose spec schema admits null: clients send `null` for "not set"."""
    from tests.openapi import spec, validator

    rows = []
    for schema, base in {
        "CreateChatCompletionRequest": _chat_body({}),
        "CreateCompletionRequest": _completion_body({}),
    }.items():
        node = spec()["components"]["schemas"][schema]
        required = set(node.get("required", ())).union(*(p.get("required", ()) for p in node.get("allOf", ())))
        for name in sorted(properties(schema)):
            if name not in required and validator(schema).is_valid({**base, name: None}):
                rows.append((schema, name))
    return rows


@pytest.mark.parametrize(("schema", "name"), _nullable_rows(), ids=[f"{s[6:-7]}.{n}" for s, n in _nullable_rows()])
async def test_null_means_not_set(api, schema, name):
    """Whatever Laneway does with a property (honour, accept, refuse), an explicit null is the
    property left out: the request is answered as if it were absent."""
    ok, _ = (getattr(api, op) for op in OPS[schema])
    limit = "max_tokens" if name != "max_tokens" else "max_completion_tokens"
    if limit not in properties(schema):  # completions' one limit is the one nulled
        await ok(**{name: None})
        return
    body = await ok(**{limit: 2, name: None})
    assert body["usage"]["completion_tokens"] == 2
