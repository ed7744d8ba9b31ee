"""Laneway behind the OpenAI clients people actually use: litellm, langchain-openai, and the
`openai` client's structured-output helpers, against bridge + broker + sim worker on a real
nats-server. The sim SIMULATES tool calls and JSON outputs valid against the schemas given;
these tests check that each client gets them back in its own types, not their words."""

from __future__ import annotations

import json
import os
from typing import Literal

# litellm stays offline: its model-cost map from the package, no telemetry, no callbacks.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")
os.environ.setdefault("LITELLM_LOG", "ERROR")

import jsonschema
import openai
import pydantic
import pytest

from loadtest.stack import Stack, demo_settings

KEY = "sk-test-third-party-key"
MODEL = "laneway-sim"
ASK = [{"role": "user", "content": "Where is my order AB123456? Open a ticket if it is late."}]

ORDER_PARAMS = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{6}$"},
        "include_items": {"type": "boolean"},
    },
    "required": ["order_id"],
    "additionalProperties": False,
}
TICKET_PARAMS = {
    "type": "object",
    "properties": {
        "priority": {"enum": ["low", "normal", "urgent"]},
        "summary": {"type": "string", "minLength": 5},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["priority", "summary", "tags"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup_order", "description": "Find an order", "parameters": ORDER_PARAMS},
    },
    {"type": "function", "function": {"name": "open_ticket", "parameters": TICKET_PARAMS}},
]
SCHEMAS = {"lookup_order": ORDER_PARAMS, "open_ticket": TICKET_PARAMS}


class Line(pydantic.BaseModel):
    sku: str
    quantity: int = pydantic.Field(ge=1)


class Ticket(pydantic.BaseModel):
    """A support ticket about an order."""

    priority: Literal["low", "normal", "urgent"]
    summary: str
    order_ids: list[str]
    lines: list[Line]
    escalate: bool


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY)) as s:
        yield s


@pytest.fixture
def base_url(stack) -> str:
    return f"{stack.url}/v1"


def _valid(name: str, arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


# -- litellm -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def litellm():
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    litellm.drop_params = False  # what the test asks for is what Laneway gets
    return litellm


async def test_litellm_tool_calls(litellm, base_url):
    response = await litellm.acompletion(
        model=f"openai/{MODEL}",
        api_base=base_url,
        api_key=KEY,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        num_retries=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id and call.type == "function"
        _valid(call.function.name, call.function.arguments)
    assert response.usage.completion_tokens > 0


async def test_litellm_streamed_tool_calls(litellm, base_url):
    stream = await litellm.acompletion(
        model=f"openai/{MODEL}",
        api_base=base_url,
        api_key=KEY,
        messages=ASK,
        tools=TOOLS,
        parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "open_ticket"}},
        stream=True,
        stream_options={"include_usage": True},
        num_retries=0,
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) >= 2
    rebuilt = litellm.stream_chunk_builder(chunks, messages=ASK)
    calls = rebuilt.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["open_ticket"]
    _valid("open_ticket", calls[0].function.arguments)
    assert rebuilt.choices[0].finish_reason == "tool_calls"


async def test_litellm_text_streamed_and_not(litellm, base_url):
    whole = await litellm.acompletion(
        model=f"openai/{MODEL}", api_base=base_url, api_key=KEY, messages=ASK, max_tokens=6, seed=21, num_retries=0
    )
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    stream = await litellm.acompletion(
        model=f"openai/{MODEL}",
        api_base=base_url,
        api_key=KEY,
        messages=ASK,
        max_tokens=6,
        seed=21,
        stream=True,
        num_retries=0,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == whole.choices[0].message.content


async def test_litellm_json_schema_response_format(litellm, base_url):
    response = await litellm.acompletion(
        model=f"openai/{MODEL}", api_base=base_url, api_key=KEY, messages=ASK, response_format=Ticket, num_retries=0
    )
    Ticket.model_validate_json(response.choices[0].message.content)


# -- langchain-openai ----------------------------------------------------------------------------
@pytest.fixture
def chat_model(base_url):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url, api_key=KEY, model=MODEL, max_retries=0, timeout=30)


async def test_langchain_bind_tools(chat_model):
    message = await chat_model.bind_tools(TOOLS, tool_choice="any").ainvoke(ASK[0]["content"])
    assert message.tool_calls and not message.invalid_tool_calls
    for call in message.tool_calls:
        assert call["id"] and call["name"] in SCHEMAS
        _valid(call["name"], call["args"])


async def test_langchain_bind_tools_streamed(chat_model):
    bound = chat_model.bind_tools(TOOLS, tool_choice="open_ticket", parallel_tool_calls=False)
    merged = None
    async for chunk in bound.astream(ASK[0]["content"]):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert [c["name"] for c in merged.tool_calls] == ["open_ticket"]
    _valid("open_ticket", merged.tool_calls[0]["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_langchain_structured_output(chat_model, method):
    structured = chat_model.with_structured_output(Ticket, method=method, include_raw=True)
    result = await structured.ainvoke(ASK[0]["content"])
    assert result["parsing_error"] is None, result["parsing_error"]
    assert isinstance(result["parsed"], Ticket)


async def test_langchain_plain_chat_and_usage(chat_model):
    message = await chat_model.bind(max_tokens=5).ainvoke(ASK[0]["content"])
    assert message.content and message.usage_metadata["output_tokens"] == 5


# -- the openai client's helpers -------------------------------------------------------------------
@pytest.fixture
def client(base_url) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)


async def test_openai_parse_with_a_pydantic_model(client):
    completion = await client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Ticket)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Ticket) and message.refusal is None


async def test_openai_parse_with_a_pydantic_function_tool(client):
    completion = await client.chat.completions.parse(
        model=MODEL,
        messages=ASK,
        tools=[openai.pydantic_function_tool(Ticket)],
        tool_choice={"type": "function", "function": {"name": "Ticket"}},
    )
    call = completion.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Ticket)


async def test_openai_streamed_parse(client):
    async with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=Ticket) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Ticket)
