"""Every text field a model (or the hosted API behind it) sees is under the tenant's PII policy.

Before issue 20 the gate analysed message content, tool-call arguments and stop sequences only:
a seeded email or phone number in a participant's `name`, a tool's description or parameter
schema, a tool call's id or name, a `refusal` content part, `response_format`'s schema, the
`user` field, `logit_bias`'s keys, or any top-level field the bridge does not type (`prediction`,
`metadata`, vLLM's `documents` and `chat_template_kwargs`, anything at all) reached the hosted
upstream raw. Image, audio and file parts, which no analyser reads, went through for a tenant
whose policy asks for PII handling; so did fields that act on the operator's hosted account
(`store`, `service_tier`, `web_search_options`), because a tenant sent them.

The engine here is the `openai` (hosted) engine, in the in-process stack (bridge, broker, worker
on a real nats-server), and what it saw is the bytes a local upstream received: the broker runs
the regex PII stage, the tenant has the default policy (email and phone redacted).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.policy.tenants import Tenant, hash_key
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack
from tests.integration.test_openai_engine import FakeUpstream, collect
from tests.requests import chat as chat_body
from workers.engine import EngineRequest, UnsupportedRequest
from workers.engines.openai.engine import OpenAIUpstreamConfig, OpenAIUpstreamEngine

pytestmark = pytest.mark.timeout(120)

KEY = "sk-pii-fields-" + "f" * 16
MODEL = "hosted"
EMAIL = "maria.garcia@example.com"
PHONE = "4155550132"
RAW = (EMAIL.encode(), PHONE.encode())
ASK = [{"role": "user", "content": "What is the status of my order?"}]


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions"):
        app.router.add_post(path, fake.handle)
    async with TestServer(app, host="127.0.0.1") as server:  # a free port
        fake.url = str(server.make_url("/v1"))
        yield fake


def hosted(upstream: FakeUpstream) -> OpenAIUpstreamConfig:
    return OpenAIUpstreamConfig(
        base_url=upstream.url, model="up-model", api_key_env="LANEWAY_TEST_NO_KEY", max_concurrency=4, retries=0
    )


@pytest.fixture(scope="module")
async def stack(nats_server, upstream: FakeUpstream):
    settings = Settings(
        tenants={"acme": Tenant(name="acme", api_key_sha256=[hash_key(KEY)])},
        models={MODEL: LogicalModel(pool="hosted")},
    )
    engine = OpenAIUpstreamEngine(hosted(upstream))
    async with Stack(nats_server.url, settings, engines=[engine], pool="hosted", prefix="piifields", pii="regex") as s:
        yield s


async def post(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.post(path, json={"model": MODEL, **body}, headers={"Authorization": f"Bearer {KEY}"}) as resp:
            return resp.status, await resp.json(content_type=None)


async def sent_upstream(
    stack: Stack, upstream: FakeUpstream, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> bytes:
    """What the hosted upstream received for `body`, which must be answered."""
    before = len(upstream.seen)
    status, answer = await post(stack, path, body)
    assert status == 200, answer
    (seen,) = upstream.seen[before:]
    return seen.raw


def tool(
    description: str = "Look up an order", parameters: dict[str, Any] | None = None, name: str = "lookup_order"
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters or {"type": "object", "properties": {"order": {"type": "string"}}},
        },
    }


SCHEMA_WITH_PII = {
    "type": "object",
    "properties": {
        "contact": {
            "type": "string",
            "description": f"Reply to {EMAIL} or call {PHONE}",
            "enum": [EMAIL, "someone else"],
            "default": EMAIL,
        }
    },
    "required": ["contact"],
}
CALL_ID = f"call_{EMAIL}"
HISTORY_WITH_CALL = [
    {"role": "user", "content": "Notify the customer."},
    {
        "role": "assistant",
        "tool_calls": [{"id": CALL_ID, "type": "function", "function": {"name": f"notify_{PHONE}", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "content": "done"},
]

# Each body carries the seeded values in one field the model (or the hosted API) receives.
CHAT_FIELDS = {
    "messages[].name": {
        "messages": [
            {"role": "user", "name": EMAIL, "content": "Hi"},
            {"role": "user", "name": f"caller_{PHONE}", "content": "Hi"},
        ]
    },
    "refusal content part": {
        "messages": [
            {"role": "assistant", "content": [{"type": "refusal", "refusal": f"I will not email {EMAIL}"}]},
            {"role": "user", "content": "Why not?"},
        ]
    },
    "tool description": {"messages": ASK, "tools": [tool(description=f"Emails {EMAIL}, texts {PHONE}")]},
    "tool parameter schema": {"messages": ASK, "tools": [tool(parameters=SCHEMA_WITH_PII)]},
    "tool name and tool_choice": {
        "messages": ASK,
        "tools": [tool(name=f"notify_{PHONE}")],
        "tool_choice": {"type": "function", "function": {"name": f"notify_{PHONE}"}},
    },
    "tool call id and name in the history": {"messages": HISTORY_WITH_CALL, "tools": [tool(name=f"notify_{PHONE}")]},
    "response_format schema": {
        "messages": ASK,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "reply", "description": f"A reply for {EMAIL}", "schema": SCHEMA_WITH_PII},
        },
    },
    "user": {"messages": ASK, "user": EMAIL},
    "logit_bias keys": {"messages": ASK, "logit_bias": {EMAIL: 1, PHONE: -1}},
    "prediction": {"messages": ASK, "prediction": {"type": "content", "content": f"Dear {EMAIL}, call {PHONE}"}},
    "metadata": {"messages": ASK, "metadata": {"contact": EMAIL, PHONE: "phone"}},
    "documents (vLLM)": {"messages": ASK, "documents": [{"title": "ticket", "text": f"From {EMAIL}, {PHONE}"}]},
    "chat_template_kwargs (vLLM)": {"messages": ASK, "chat_template_kwargs": {"customer": EMAIL, "phone": PHONE}},
}


@pytest.mark.parametrize("field", CHAT_FIELDS)
async def test_a_seeded_value_in_a_chat_field_never_reaches_the_engine(stack, upstream, field):
    raw = await sent_upstream(stack, upstream, {"max_tokens": 4, **CHAT_FIELDS[field]})
    assert not [v for v in RAW if v in raw], raw


async def test_a_tool_name_keeps_matching_its_tool_choice_after_redaction(stack, upstream):
    """Identifiers are rewritten name-safe and the same everywhere they occur, so the upstream
    still finds the tool the client named (OpenAI refuses `<` `>` in a name)."""
    named = CHAT_FIELDS["tool name and tool_choice"]
    sent = json.loads(await sent_upstream(stack, upstream, {"max_tokens": 4, **named}))
    name = sent["tools"][0]["function"]["name"]
    assert name == sent["tool_choice"]["function"]["name"] == "notify_PHONE_NUMBER"
    called = CHAT_FIELDS["tool call id and name in the history"]
    history = json.loads(await sent_upstream(stack, upstream, {"max_tokens": 4, **called}))
    call = history["messages"][1]["tool_calls"][0]
    assert call["id"] == history["messages"][2]["tool_call_id"] and "<" not in call["id"]


async def test_a_seeded_value_in_a_completions_field_never_reaches_the_engine(stack, upstream):
    body = {"prompt": "Say hi", "max_tokens": 4, "user": EMAIL, "logit_bias": {PHONE: 1}}
    raw = await sent_upstream(stack, upstream, body, "/v1/completions")
    assert not [v for v in RAW if v in raw], raw


async def test_a_seeded_value_in_a_responses_tool_never_reaches_the_engine(stack, upstream):
    body = {
        "input": "Where is my order?",
        "max_output_tokens": 16,
        "tools": [
            {"type": "function", "name": "lookup_order", "description": f"Ask {EMAIL}", "parameters": SCHEMA_WITH_PII}
        ],
    }
    raw = await sent_upstream(stack, upstream, body, "/v1/responses")
    assert not [v for v in RAW if v in raw], raw


PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + EMAIL.encode()).decode()
UNANALYSABLE = {
    "image_url": {"type": "image_url", "image_url": {"url": PNG}},
    "input_audio": {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(EMAIL.encode()).decode(), "format": "wav"},
    },
    "file": {
        "type": "file",
        "file": {"file_data": base64.b64encode(EMAIL.encode()).decode(), "filename": "ticket.pdf"},
    },
}


@pytest.mark.parametrize("kind", UNANALYSABLE)
async def test_a_part_no_analyser_reads_is_refused_naming_it(stack, upstream, kind):
    before = len(upstream.seen)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What does this say?"}, UNANALYSABLE[kind]]}]
    status, body = await post(stack, "/v1/chat/completions", {"max_tokens": 4, "messages": messages})
    assert status == 400, body
    assert body["error"]["code"] == "pii_blocked" and body["error"]["param"] == "messages[0].content[1]"
    assert kind in body["error"]["message"]
    assert len(upstream.seen) == before


@pytest.mark.parametrize(
    "field, value",
    [
        ("store", True),
        ("service_tier", "priority"),
        ("web_search_options", {"search_context_size": "high"}),
        ("prompt_cache_retention", "24h"),
    ],
)
async def test_a_tenant_cannot_act_on_the_operators_hosted_account(stack, upstream, field, value):
    before = len(upstream.seen)
    status, body = await post(stack, "/v1/chat/completions", {"max_tokens": 4, "messages": ASK, field: value})
    assert status == 400 and body["error"]["param"] == field, body
    assert len(upstream.seen) == before


async def test_an_unknown_field_is_refused_not_forwarded(stack, upstream):
    before = len(upstream.seen)
    status, body = await post(
        stack, "/v1/chat/completions", {"max_tokens": 4, "messages": ASK, "frobnicate": {"note": "x"}}
    )
    assert status == 400 and body["error"]["param"] == "frobnicate", body
    assert len(upstream.seen) == before


async def test_account_fields_the_operator_allows_are_forwarded(upstream, monkeypatch):
    """The operator's engine config, not the tenant, decides what acts on the account; a
    tenant's `store: false` / `service_tier: "auto"` (what the upstream does anyway) pass quietly."""
    config = replace(hosted(upstream), allow_fields=frozenset({"service_tier"}))
    engine = OpenAIUpstreamEngine(config)
    await engine.start()
    try:
        before = len(upstream.seen)
        body = chat_body("Hi", model="m", max_tokens=2)
        await collect(engine, EngineRequest("a1", body, b'{"service_tier":"flex","store":false}'))
        (seen,) = upstream.seen[before:]
        assert seen.body["service_tier"] == "flex" and "store" not in seen.body
        with pytest.raises(UnsupportedRequest) as err:
            await collect(engine, EngineRequest("a2", body, b'{"store":true}'))
        assert err.value.param == "store"
    finally:
        await engine.cleanup()
