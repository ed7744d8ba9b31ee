"""The SIMULATED engine speaks OpenAI: n choices, natural stops, exact stop strings, tool calls
and JSON outputs that validate against their schemas, logprobs, and extras accepted or refused.
It runs on the zero profile (no step delays), so nothing here waits for time to pass."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import jsonschema
import msgspec
import pytest

from schemas.openai import ChatBody, CompletionBody
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, UnsupportedRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.engines.sim.schema import SchemaUnsupported, instance

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER

ORDER_LOOKUP = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$", "description": "e.g. ORD-123456"},
        "email": {"type": "string", "format": "email"},
        "include_items": {"type": "boolean"},
    },
    "required": ["order_id"],
    "additionalProperties": False,
}
CREATE_TICKET = {
    "$defs": {
        "contact": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 80},
                "phone": {"type": ["string", "null"], "pattern": "^\\+[1-9][0-9]{7,14}$"},
            },
            "required": ["name", "phone"],
            "additionalProperties": False,
        },
        "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
    },
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 5, "maxLength": 120},
        "priority": {"$ref": "#/$defs/priority"},
        "contact": {"$ref": "#/$defs/contact"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["billing", "shipping", "bug"]},
            "minItems": 1,
            "maxItems": 3,
            "uniqueItems": True,
        },
        "due": {"type": "string", "format": "date"},
        "estimate_hours": {"type": "number", "exclusiveMinimum": 0, "maximum": 40, "multipleOf": 0.5},
        "attachments": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"url": {"type": "string", "format": "uri"}, "bytes": {"type": "integer", "minimum": 1}},
                "required": ["url"],
            },
        },
    },
    "required": ["title", "priority", "contact", "tags"],
    "additionalProperties": False,
}
REFUND = {  # allOf / oneOf / const / definitions (draft-07 spelling)
    "definitions": {
        "money": {
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "minimum": 1, "maximum": 10_000},
                "currency": {"const": "EUR"},
            },
            "required": ["amount", "currency"],
        }
    },
    "allOf": [
        {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        {"properties": {"refund": {"$ref": "#/definitions/money"}}, "required": ["refund"]},
    ],
    "properties": {"reason": {"oneOf": [{"type": "string", "enum": ["damaged", "late"]}, {"type": "null"}]}},
}
SCHEMAS = [ORDER_LOOKUP, CREATE_TICKET, REFUND]
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "parameters": ORDER_LOOKUP}},
    {"type": "function", "function": {"name": "create_ticket", "parameters": CREATE_TICKET}},
    {"type": "function", "function": {"name": "refund", "parameters": REFUND}},
]


def chat(content: Any = "Where is my parcel? It was due on Monday.", **fields: Any) -> ChatBody:
    messages = fields.pop("messages", [{"role": "user", "content": content}])
    return msgspec.convert({"model": "sim", "messages": messages, **fields}, ChatBody)


@pytest.fixture
async def engine():
    e = SimEngine(PROFILES["zero"])
    await e.start()
    yield e
    await e.cleanup()


async def run(engine: SimEngine, body: Any, extra: dict | None = None, **kw: Any) -> list[EngineOutput]:
    request = EngineRequest("r", body, json.dumps(extra).encode() if extra else b"", **kw)
    return [out async for out in engine.generate(request)]


def text(outs: list[EngineOutput], index: int = 0) -> str:
    return "".join(o.text for o in outs if o.index == index)


def calls(outs: list[EngineOutput], index: int = 0) -> list[dict[str, str]]:
    found: dict[int, dict[str, str]] = {}
    for out in (o for o in outs if o.index == index):
        for d in out.tool_calls:
            call = found.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += d.id
            call["name"] += d.name
            call["arguments"] += d.arguments
    return [found[i] for i in sorted(found)]


# -- prompts, choices, lengths --------------------------------------------------------------------
async def test_prompt_tokens_count_every_text_part_and_completion_prompts(engine):
    parts = [{"type": "text", "text": "a" * 40}, {"type": "text", "text": "b" * 40}]
    assert (await run(engine, chat(parts, max_tokens=1)))[-1].prompt_tokens == 20
    body = CompletionBody(model="sim", prompt="x" * 41, max_tokens=2)
    outs = await run(engine, body)
    assert (outs[-1].prompt_tokens, outs[-1].completion_tokens, outs[-1].finish_reason) == (11, 2, "length")


async def test_n_choices_each_hold_a_slot_and_report_their_own_finish(engine):
    body = chat(n=3, max_tokens=500, temperature=0.9)
    stream = engine.generate(EngineRequest("r", body, b'{"ignore_eos": true}', klass="interactive"))
    first = await anext(stream)
    cap = engine.capacity()
    assert cap.free_slots == engine.max_seqs - 3 and cap.running == {"interactive": 3}
    outs = [first] + [out async for out in stream]
    assert {o.index for o in outs} == {0, 1, 2}
    final = outs[-1]
    assert final.finish_reasons == ["length"] * 3 and final.completion_tokens == 1500
    assert sum(len(o.token_ids) for o in outs) == 1500
    assert engine.capacity().free_slots == engine.max_seqs and engine.capacity().token_budget == engine.kv_tokens


async def test_greedy_choices_agree_and_seeded_requests_repeat(engine):
    greedy = await run(engine, chat(n=2, temperature=0.0))
    assert text(greedy, 0) == text(greedy, 1)
    seeded = [text(await run(engine, chat(n=2, seed=7)), i) for i in (0, 1)]
    assert seeded == [text(await run(engine, chat(n=2, seed=7)), i) for i in (0, 1)]


async def test_without_a_limit_the_answer_ends_at_a_natural_length(engine):
    lengths = set()
    for i in range(8):
        final = (await run(engine, chat(f"question number {i}", temperature=0.0)))[-1]
        assert final.finish_reason == "stop" and 16 <= final.completion_tokens <= 200
        lengths.add(final.completion_tokens)
    assert len(lengths) > 1, "the natural length should depend on the prompt"
    again = (await run(engine, chat("question number 0", temperature=0.0)))[-1]
    assert (
        again.completion_tokens == (await run(engine, chat("question number 0", temperature=0.0)))[-1].completion_tokens
    )


async def test_without_a_limit_the_context_caps_the_answer():
    engine = SimEngine(PROFILES["zero"], max_model_len=12)
    await engine.start()
    try:
        final = (await run(engine, chat("hi"), {"ignore_eos": True}))[-1]
        assert (final.finish_reason, final.completion_tokens) == ("length", 12 - final.prompt_tokens)
        with pytest.raises(UnsupportedRequest) as refused:
            await run(engine, chat("hi", max_tokens=50))
        assert refused.value.param == "max_tokens"
        with pytest.raises(UnsupportedRequest) as refused:
            await run(engine, chat("x" * 200))
        assert refused.value.param == "messages"
    finally:
        await engine.cleanup()


# -- stop strings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stop", ["GPU", "d GPU e", "s f", "ing. Lane", "a m", "tokens from a modelled"])
async def test_a_stop_string_never_reaches_the_output_not_even_in_part(engine, stop):
    full = text(await run(engine, chat(temperature=0.0, max_tokens=60)))
    assert stop in full
    outs = await run(engine, chat(temperature=0.0, max_tokens=60, stop=[stop, "never there"]))
    assert text(outs) == full[: full.find(stop)]
    assert outs[-1].finish_reason == "stop"
    streamed = ""
    for out in outs:  # no delta ever carried a fragment of the stop past the cut
        streamed += out.text
        assert full.startswith(streamed) and len(streamed) <= full.find(stop)


async def test_include_stop_str_in_output_keeps_the_stop_and_min_tokens_delays_it(engine):
    full = text(await run(engine, chat(temperature=0.0, max_tokens=60)))
    kept = text(
        await run(engine, chat(temperature=0.0, max_tokens=60, stop="GPU"), {"include_stop_str_in_output": True})
    )
    assert kept == full[: full.find("GPU") + 3]
    tokens = [
        lp.token for o in await run(engine, chat(temperature=0.0, max_tokens=60, logprobs=True)) for lp in o.logprobs
    ]
    late = await run(engine, chat(temperature=0.0, max_tokens=60, stop="GPU"), {"min_tokens": 20})
    checked_from = len("".join(tokens[:19])) - 2  # stops count from the 20th token on, as in vLLM
    assert late[-1].completion_tokens >= 20 and text(late) == full[: full.find("GPU", checked_from)]


# -- tools -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
async def test_required_tool_calls_stream_openai_style_with_valid_arguments(engine, seed):
    outs = await run(engine, chat(tools=TOOLS, tool_choice="required", seed=seed))
    assert outs[-1].finish_reason == "tool_calls"
    found = calls(outs)
    assert 1 <= len(found) <= 2
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in found:
        assert call["id"].startswith("call_") and int(call["id"][5:], 16) >= 0
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]], format_checker=FORMATS)
    headers = [d for o in outs for d in o.tool_calls if d.id]
    assert all(d.name and not d.arguments for d in headers), "the first delta names the call, no arguments"


async def test_arguments_arrive_in_token_sized_fragments(engine):
    fragments = []
    async for out in engine.generate(EngineRequest("r", chat(tools=TOOLS[:1], tool_choice="required"))):
        fragments += [d.arguments for d in out.tool_calls if not d.id]
    assert len(fragments) > 3 and all(len(f) <= 8 for f in fragments)


async def test_tool_choice_none_named_and_auto_after_a_tool_result(engine):
    none = await run(engine, chat(tools=TOOLS, tool_choice="none"))
    assert text(none) and not calls(none) and none[-1].finish_reason == "stop"
    named = await run(engine, chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "refund"}}))
    assert [c["name"] for c in calls(named)] == ["refund"]
    assert calls(await run(engine, chat(tools=TOOLS)))  # auto, with tools: a call
    history = [
        {"role": "user", "content": "Where is ORD-123456?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id":"ORD-123456"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    ]
    done = await run(engine, chat(messages=history, tools=TOOLS))
    assert text(done) and not calls(done) and done[-1].finish_reason == "stop"


async def test_parallel_tool_calls_false_makes_one_call(engine):
    counts = {len(calls(await run(engine, chat(tools=TOOLS, tool_choice="required", seed=s)))) for s in range(12)}
    assert counts == {1, 2}
    single = {
        len(calls(await run(engine, chat(tools=TOOLS, tool_choice="required", seed=s, parallel_tool_calls=False))))
        for s in range(12)
    }
    assert single == {1}


# -- structured outputs --------------------------------------------------------------------------
async def test_json_object_and_json_schema_outputs_parse_and_validate(engine):
    obj = json.loads(text(await run(engine, chat(response_format={"type": "json_object"}))))
    assert isinstance(obj["answer"], str)
    for schema in SCHEMAS:
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
        outs = await run(engine, chat(response_format=fmt))
        assert sum(1 for o in outs if o.text) > 3, "streamed in pieces"
        jsonschema.validate(json.loads(text(outs)), schema, format_checker=FORMATS)


@pytest.mark.parametrize(
    "schema",
    [
        *SCHEMAS,
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        {
            "type": "object",
            "properties": {"n": {"type": "number", "minimum": 0.25, "maximum": 0.5}},
            "required": ["n"],
            "minProperties": 2,
        },
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                    "required": ["children"],
                }
            },
            "$ref": "#/$defs/node",
        },
        {"type": "string", "format": "uuid"},
        {},
        True,
    ],
)
def test_generated_instances_validate(schema):
    for seed in range(25):
        jsonschema.validate(instance(schema, random.Random(seed)), schema, format_checker=FORMATS)


async def test_an_unsatisfiable_schema_is_refused_not_answered_invalidly(engine):
    with pytest.raises(SchemaUnsupported):
        instance({"type": "integer", "minimum": 5, "maximum": 4}, random.Random(0))
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"enum": []}}}
    with pytest.raises(UnsupportedRequest) as refused:
        await run(engine, chat(response_format=fmt))
    assert refused.value.param == "response_format.json_schema.schema"


# -- logprobs and confidence ---------------------------------------------------------------------
async def test_chat_logprobs_give_each_token_its_top_alternatives(engine):
    outs = await run(engine, chat(logprobs=True, top_logprobs=3, max_tokens=20), confidence=True)
    logprobs = [lp for o in outs for lp in o.logprobs]
    assert len(logprobs) == 20 and "".join(lp.token for lp in logprobs) == text(outs)
    for lp in logprobs:
        assert lp.logprob <= 0 and lp.bytes == list(lp.token.encode())
        assert len(lp.top) == 3 and [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert lp.top[0].logprob >= lp.logprob and any(t.token == lp.token for t in lp.top)
        assert sum(2.718281828**t.logprob for t in lp.top) <= 1.0 + 1e-9
    confidence = [c for o in outs for c in o.confidence]
    assert (
        len(confidence) == 20
        and len(set(confidence)) == 1
        and confidence[0] == engine.confidence(EngineRequest("r", chat()))
    )


async def test_completion_logprobs_and_no_logprobs_unless_asked(engine):
    outs = await run(engine, CompletionBody(model="sim", prompt="Once upon a time", logprobs=2, max_tokens=5))
    assert [len(lp.top) for o in outs for lp in o.logprobs] == [2] * 5
    plain = await run(engine, chat(max_tokens=5))
    assert not any(o.logprobs or o.confidence for o in plain)


# -- extras --------------------------------------------------------------------------------------
async def test_sampling_extras_and_metadata_are_accepted(engine):
    extra = {
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "skip_special_tokens": True,
        "metadata": {"team": "support"},
        "store": False,
        "service_tier": "auto",
        "prompt_cache_key": "k",
        "safety_identifier": "u1",
    }
    assert (await run(engine, chat(max_tokens=4), extra))[-1].finish_reason == "length"


async def test_min_tokens_and_ignore_eos_are_honoured(engine):
    natural = (await run(engine, chat(temperature=0.0)))[-1].completion_tokens
    longer = (await run(engine, chat(temperature=0.0), {"min_tokens": natural + 30}))[-1]
    assert longer.completion_tokens == natural + 30 and longer.finish_reason == "stop"
    forced = (await run(engine, chat(max_tokens=300), {"ignore_eos": True}))[-1]
    assert (forced.completion_tokens, forced.finish_reason) == (300, "length")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"top_k": "many"}, "top_k"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"min_tokens": 10}, "min_tokens"),  # more than max_tokens=4
    ],
)
async def test_unknown_or_unhonourable_extras_are_refused_by_name(engine, extra, param):
    with pytest.raises(UnsupportedRequest) as refused:
        await run(engine, chat(max_tokens=4), extra)
    assert refused.value.param == param
    assert engine.capacity().free_slots == engine.max_seqs


async def test_images_are_refused_naming_the_message(engine):
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
    ]
    with pytest.raises(UnsupportedRequest) as refused:
        await run(engine, chat(messages=messages))
    assert refused.value.param == "messages[1].content"


async def test_completion_echo_and_best_of(engine):
    outs = await run(engine, CompletionBody(model="sim", prompt="Once upon", echo=True, max_tokens=3))
    assert text(outs).startswith("Once upon") and outs[-1].completion_tokens == 3
    with pytest.raises(UnsupportedRequest) as refused:
        await run(engine, CompletionBody(model="sim", prompt="x", best_of=3))
    assert refused.value.param == "best_of"


# -- scheduling ------------------------------------------------------------------------------------
async def test_waiting_requests_are_admitted_by_priority_then_arrival():
    engine = SimEngine(PROFILES["zero"], max_seqs=1)
    done: list[str] = []

    async def one(rid: str, priority: int) -> None:
        async for out in engine.generate(EngineRequest(rid, chat(max_tokens=3), priority=priority)):
            if out.finish_reason:
                done.append(rid)

    tasks = [asyncio.create_task(one(rid, p)) for rid, p in (("late", 9), ("first", 1), ("second", 1))]
    assert await eventually(lambda: engine.num_running() == 3)  # all queued before the loop starts
    await engine.start()
    try:
        await asyncio.gather(*tasks)
    finally:
        await engine.cleanup()
    assert done == ["first", "second", "late"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": 1_000_000_000},  # would build a 1 GB string
        {"type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 1000}},
        {"type": "string", "pattern": "a{1000000000}"},
        {"properties": {"x": 5}},  # malformed: not a schema
        {"enum": 5},
    ],
)
def test_a_schema_the_sim_cannot_or_should_not_expand_is_refused_by_name(schema) -> None:
    import random

    from workers.engines.sim.schema import SchemaUnsupported, instance

    with pytest.raises(SchemaUnsupported):
        instance(schema, random.Random(0))
