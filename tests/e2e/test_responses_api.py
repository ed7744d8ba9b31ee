"""`POST /v1/responses` end to end with the official `openai` client: bridge + broker +
sim worker on a real nats-server. Every event and every Response must parse with the client's
own models; the sim SIMULATES tool calls and JSON, so these tests check shapes, not words."""

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
}
TICKET_TOOL = {
    "type": "function",
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
}
TOOLS = [ORDER_TOOL, TICKET_TOOL]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
ASK = "Where is my order AB123456?"


# -- text -------------------------------------------------------------------------------------------
async def test_text_in_text_out(client):
    response = await client.responses.create(
        model=MODEL, input="Say hello", instructions="Be brief.", metadata={"trace": "t1"}, user="u-1"
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.error is None and response.incomplete_details is None
    assert response.output_text
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert response.instructions == "Be brief." and response.metadata == {"trace": "t1"} and response.user == "u-1"
    assert response.model_extra.get("store") is True  # OpenAI's default (tests/e2e/test_stored_responses.py)
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0


async def test_message_items_with_parts_and_roles(client):
    short = await client.responses.create(model=MODEL, input="hi", max_output_tokens=4, temperature=0)
    response = await client.responses.create(
        model=MODEL,
        max_output_tokens=4,
        temperature=0,
        input=[
            {"role": "developer", "content": "Answer in English."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Summarise this order."},
                    {"type": "input_text", "text": "It is AB123456."},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]},
            {"role": "user", "content": "Go on."},
        ],
    )
    assert response.output_text
    assert response.usage.input_tokens > short.usage.input_tokens


async def test_max_output_tokens_gives_an_incomplete_response(client):
    response = await client.responses.create(model=MODEL, input=ASK, max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.max_output_tokens == 3
    assert response.output[0].status == "incomplete"


# -- streaming --------------------------------------------------------------------------------------
async def test_streamed_events_in_order(client):
    stream = await client.responses.create(model=MODEL, input="Say hello", stream=True)
    events = [e async for e in stream]
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and set(types[4:-4]) == {"response.output_text.delta"}
    created, done, final = events[0].response, events[-4], events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.id == final.id
    text = "".join(d.delta for d in deltas)
    assert done.text == text == final.output_text
    assert {d.item_id for d in deltas} == {final.output[0].id}
    assert final.status == "completed" and final.usage.output_tokens >= 1


async def test_raw_stream_is_named_events_without_done(stack):
    body = {"model": MODEL, "input": "hello", "max_output_tokens": 4, "stream": True}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        reply = await http.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in reply.text.split("\n\n") if b.strip()]
    assert "[DONE]" not in reply.text
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]
    assert json.loads(blocks[-1].split("\n")[1][6:])["type"] == "response.incomplete"


async def test_streamed_text_matches_the_non_streamed_answer(client):
    plain = await client.responses.create(model=MODEL, input=ASK, max_output_tokens=12, temperature=0)
    stream = await client.responses.create(model=MODEL, input=ASK, max_output_tokens=12, temperature=0, stream=True)
    final = [e async for e in stream][-1]
    assert final.type == "response.incomplete" and final.response.output_text == plain.output_text


# -- tools ------------------------------------------------------------------------------------------
def _calls(response):
    return [item for item in response.output if item.type == "function_call"]


async def test_function_tools_with_tool_choice_required(client):
    response = await client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required")
    calls = _calls(response)
    assert calls and response.status == "completed"
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert [t.name for t in response.tools] == ["lookup_order", "open_ticket"]
    assert response.tool_choice == "required"


async def test_named_function_tool_choice(client):
    response = await client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "open_ticket"}
    )
    assert [c.name for c in _calls(response)] == ["open_ticket"]


async def test_streamed_function_call_events(client):
    stream = await client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, stream=True
    )
    events = [e async for e in stream]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == 1 and added[0].item.type == "function_call" and added[0].item.arguments == ""
    item_id = added[0].item.id
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.item_id == item_id and done.arguments == "".join(deltas)
    [item_done] = [e for e in events if e.type == "response.output_item.done"]
    assert item_done.item.arguments == done.arguments and item_done.item.status == "completed"
    assert events[-1].type == "response.completed"
    jsonschema.validate(json.loads(done.arguments), SCHEMAS[item_done.item.name])


async def test_a_tool_result_round_trip(client):
    first = await client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=64
    )
    [call] = _calls(first)
    history = [
        {"role": "user", "content": ASK},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"status": "shipped"}'},
    ]
    second = await client.responses.create(model=MODEL, input=history, tools=TOOLS, max_output_tokens=16)
    assert second.output_text and not _calls(second)
    assert second.usage.input_tokens > first.usage.input_tokens


# -- structured output ------------------------------------------------------------------------------
class Ticket(pydantic.BaseModel):
    priority: str
    summary: str
    order_ids: list[str]


async def test_json_schema_text_format(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    response = await client.responses.create(
        model=MODEL,
        input="Plan a trip",
        text={"format": {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"
    parsed = await client.responses.parse(model=MODEL, input=ASK, text_format=Ticket)
    assert isinstance(parsed.output_parsed, Ticket)


# -- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [ORDER_TOOL, {"type": "web_search"}]}, "tools[1].type"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        # Chat's own fields are not this endpoint's: they would bypass what the gate checked
        # (PII in `messages`, the slots `n` takes).
        ({"extra_body": {"messages": [{"role": "user", "content": "x"}]}}, "messages"),
        ({"extra_body": {"n": 8}}, "n"),
    ],
)
async def test_unsupported_fields_are_refused_by_name(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, **{"input": ASK, **fields})
    assert err.value.body["param"] == param


async def test_unknown_fields_reach_the_engine(client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, input=ASK, extra_body={"frobnicate": True})
    assert err.value.body["param"] == "frobnicate"
    accepted = await client.responses.create(
        model=MODEL,
        input=ASK,
        max_output_tokens=3,
        store=False,
        extra_body={"top_k": 5},
        truncation="disabled",
        safety_identifier="s-1",
        prompt_cache_key="k-1",
    )
    assert accepted.output_text and accepted.truncation == "disabled" and accepted.safety_identifier == "s-1"


# -- strict shapes: the client's models VALIDATE every event and body (its parsing is lenient) -----
@pytest.mark.parametrize(
    "fields",
    [
        {"input": "Say hello"},
        {
            "input": ASK,
            "max_output_tokens": 3,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "temperature": 0,
        },
        {"input": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0},
        {"input": ASK, "text": {"format": {"type": "json_object"}}, "temperature": 0.5, "top_p": 0.9},
    ],
)
async def test_every_event_and_body_validates_against_the_clients_models(stack, fields):
    from openai.types.responses import Response, ResponseStreamEvent

    events = pydantic.TypeAdapter(ResponseStreamEvent)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        plain = await http.post("/v1/responses", json={"model": MODEL, **fields}, headers=headers)
        streamed = await http.post("/v1/responses", json={"model": MODEL, "stream": True, **fields}, headers=headers)
    assert plain.status_code == 200, plain.text
    body = Response.model_validate(plain.json())
    assert body.output and plain.json()["store"] is True
    parsed = [
        events.validate_python(json.loads(block.split("\n")[1][6:]))
        for block in streamed.text.split("\n\n")
        if block.strip()
    ]
    final = parsed[-1].response
    assert final.status == body.status and [i.type for i in final.output] == [i.type for i in body.output]
    if "include" in fields:
        logprobs = body.output[0].content[0].logprobs
        assert len(logprobs) == 3 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
        assert [lp.token for lp in final.output[0].content[0].logprobs] == [lp.token for lp in logprobs]


def test_reasoning_refusal_and_a_mid_stream_failure_render_as_the_client_expects():
    """Entries the sim does not produce (reasoning, refusals, an error after the first token),
    straight through the renderer: every event validates, sequence numbers run on."""
    from openai.types.responses import Response, ResponseStreamEvent

    from bridge.errors import from_code
    from bridge.render.responses import ResponsesRenderer
    from schemas.frames import Delta, Finished, TokenUsage, ToolCallDelta
    from schemas.requests import GenerateRequest
    from schemas.responses import ResponsesBody

    generate = GenerateRequest(
        request_id="r1", tenant="t", klass="c", model=MODEL, reply_to="x", created_at=1.0, deadline=2.0
    )
    deltas = [
        Delta("r1", 1, 0, "", reasoning="think"),
        Delta("r1", 1, 1, "", reasoning=" more"),
        Delta("r1", 1, 2, "Hi"),
        Delta("r1", 1, 3, " there"),
        Delta("r1", 1, 4, "", refusal="no"),
        Delta("r1", 1, 5, "", tool_calls=[ToolCallDelta(0, "call_1", "f", '{"a"')]),
        Delta("r1", 1, 6, "", tool_calls=[ToolCallDelta(0, arguments=": 1}")]),
    ]
    events = pydantic.TypeAdapter(ResponseStreamEvent)

    def parse(data: bytes) -> list:
        return [events.validate_python(json.loads(b.split(b"\n")[1][6:])) for b in data.split(b"\n\n") if b.strip()]

    for ending in ("finish", "failed"):
        render = ResponsesRenderer(generate, ResponsesBody(model=MODEL, stream=True))
        out = render.start() + b"".join(render.delta(d) for d in deltas)
        out += (
            render.finish(Finished("r1", 1, 7, "tool_calls", TokenUsage(5, 7)))
            if ending == "finish"
            else render.failed(from_code("worker_lost", "the worker went away"))
        )
        parsed = parse(out)
        assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
        final = parsed[-1].response
        assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
        assert final.output[1].content[0].text == "Hi there" and final.output[1].content[1].refusal == "no"
        assert final.output[2].arguments == '{"a": 1}' and final.output[2].call_id == "call_1"
        if ending == "failed":
            assert parsed[-1].type == "response.failed" and final.error.code == "server_error"
        else:
            assert parsed[-1].type == "response.completed"
    render = ResponsesRenderer(generate, ResponsesBody(model=MODEL))
    for d in deltas:
        render.add(d)
    body = Response.model_validate_json(render.body(Finished("r1", 1, 7, "tool_calls", TokenUsage(5, 7))))
    assert body.output_text == "Hi there" and body.output[0].content[0].text == "think more"
