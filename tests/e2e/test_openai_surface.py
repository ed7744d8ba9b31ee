"""The OpenAI surface beyond plain chat, end to end with the official `openai` client: bridge +
broker + sim worker on a real nats-server. The sim SIMULATES tool calls, JSON outputs and
logprobs; these tests check their shape and that Laneway carries them whole, not their words."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import KEY

MODEL = "laneway-sim"

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
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Where is my order AB123456?"}]


def _valid_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


# -- tools ------------------------------------------------------------------------------------
async def test_tool_call_non_streamed_validates_against_the_tool_schema(client):
    completion = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id
        _valid_call(call.function.name, call.function.arguments)


async def test_named_tool_choice_calls_that_tool(client):
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "open_ticket"}}
    )
    calls = completion.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["open_ticket"]
    _valid_call("open_ticket", calls[0].function.arguments)


async def test_streamed_tool_call_deltas_have_openais_shape(client):
    stream = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, stream=True
    )
    chunks = [c async for c in stream]
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas, "no tool-call deltas streamed"
    first = deltas[0]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name
    assert all(d.index == 0 for d in deltas)  # parallel_tool_calls=False: one call
    assert all(d.id is None for d in deltas[1:])  # later pieces carry arguments only
    _valid_call(first.function.name, "".join(d.function.arguments or "" for d in deltas))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


async def test_tool_choice_none_answers_in_text(client):
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    message = completion.choices[0].message
    assert message.tool_calls is None and message.content


async def test_an_agent_loop_ends_with_text_after_the_tool_result(client):
    first = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'},
    ]
    second = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=16)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content
    # The tool call and its result reached the model: the prompt grew by more than the new turn.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


async def test_a_tool_choice_naming_no_tool_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "refund"}}
        )
    assert err.value.body["param"] == "tool_choice"


# -- structured outputs -------------------------------------------------------------------------
class Ticket(pydantic.BaseModel):
    priority: str
    summary: str
    order_ids: list[str]


async def test_parse_with_a_pydantic_schema(client):
    completion = await client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Ticket)
    ticket = completion.choices[0].message.parsed
    assert isinstance(ticket, Ticket)


async def test_json_object_streams_valid_json(client):
    stream = await client.chat.completions.create(
        model=MODEL, messages=ASK, stream=True, response_format={"type": "json_object"}
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


# -- logprobs, n, stop, limits ------------------------------------------------------------------
async def test_logprobs_with_top_alternatives(client):
    completion = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = completion.choices[0].logprobs.content
    assert len(content) >= 1
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)


async def test_streamed_logprobs(client):
    stream = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, stream=True, logprobs=True, top_logprobs=1
    )
    tokens = [
        t
        for c in [c async for c in stream]
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert len(tokens) >= 1 and all(t.logprob <= 0 for t in tokens)


async def test_n_gives_n_choices_and_meters_them_all(client):
    completion = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, n=3)
    assert sorted(c.index for c in completion.choices) == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in completion.choices)
    assert completion.usage.completion_tokens == 12


async def test_stop_leaves_no_fragment_of_the_stop_string(client):
    plain = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    text = plain.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # spans wherever the middle falls
    stopped = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0, stop=stop)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


async def test_omitted_max_tokens_is_not_cut_at_a_fixed_limit(client):
    completion = await client.chat.completions.create(model=MODEL, messages=ASK)
    assert completion.choices[0].finish_reason == "stop"  # the simulated model's own end
    assert completion.choices[0].message.refusal is None


async def test_unknown_fields_reach_the_engine_which_refuses_what_it_cannot_honour(client):
    accepted = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, extra_body={"top_k": 5})
    assert accepted.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, extra_body={"frobnicate": True})
    assert err.value.body["param"] == "frobnicate"


async def test_image_parts_are_refused_by_name_where_the_pool_cannot_see(client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=MODEL,
            max_tokens=3,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    ],
                }
            ],
        )
    assert err.value.body["param"].startswith("messages[0]")


# -- text completions, models, headers ----------------------------------------------------------
async def test_text_completions_stream_and_not(client):
    completion = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage.completion_tokens == 5
    stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == completion.choices[0].text or len(chunks) >= 2


async def test_retrieve_a_model(client):
    model = await client.models.retrieve(MODEL)
    assert model.id == MODEL
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


async def test_request_id_header_echoes_the_clients_or_is_generated(stack):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        mine = await http.post("/v1/chat/completions", json=body, headers={**headers, "X-Request-Id": "trace-42"})
        generated = await http.post("/v1/chat/completions", json=body, headers=headers)
        refused = await http.post(
            "/v1/chat/completions", json={**body, "n": 99}, headers={**headers, "X-Request-Id": "trace-43"}
        )
        models = await http.get("/v1/models", headers={**headers, "X-Request-Id": "trace-44"})
        missing = await http.get("/v1/nowhere", headers=headers)
    assert mine.status_code == 200 and mine.headers["x-request-id"] == "trace-42"
    assert generated.headers["x-request-id"] and int(generated.headers["openai-processing-ms"]) >= 0
    assert refused.status_code == 400 and refused.headers["x-request-id"] == "trace-43"
    assert models.headers["x-request-id"] == "trace-44" and missing.headers["x-request-id"]
