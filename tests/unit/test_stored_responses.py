"""The stored responses' pure parts: chat messages → input items, paging, a background record's
staleness, the echo a worker sends back (never past the frame's room), and what a stored Response
repeats of its request (only what came back from the gate: withheld until then)."""

from __future__ import annotations

import msgspec
import orjson

from bridge.render.stored import kept_of, stored_view
from bridge.responses.stored.items import page, to_items
from bridge.responses.stored.lifecycle import BRIDGE_LOST, ended, lost, running, stale
from schemas.openai import (
    ChatBody,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    Message,
    ResponseFormat,
    Tool,
    ToolCall,
)
from schemas.requests import MAX_ECHO_BYTES, Echoed, GenerateRequest
from schemas.responses import ResponsesBody, ResponsesTool, TextConfig, TextFormat
from schemas.stored import StoredResponse


def test_messages_become_items_with_stable_ids():
    items = to_items(
        [
            Message(
                role="user",
                content=[{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}],
            ),
            Message(
                role="assistant",
                content="calling",
                tool_calls=[ToolCall(id="c1", function=FunctionCall(name="f", arguments="{}"))],
            ),
            Message(role="tool", tool_call_id="c1", content="42"),
        ],
        "r1",
    )
    assert [(i["id"], i["type"]) for i in items] == [
        ("msg_r1_0", "message"),
        ("msg_r1_1", "message"),
        ("fc_r1_2", "function_call"),
        ("fco_r1_3", "function_call_output"),
    ]
    assert items[0]["content"] == [
        {"type": "input_text", "text": "hi"},
        {"type": "input_image", "image_url": "data:x", "detail": "auto"},
    ]
    assert items[3]["call_id"] == "c1" and items[3]["output"] == "42"


def test_paging_by_order_after_and_limit():
    items = [{"id": str(i)} for i in range(5)]
    desc = page(items, after=None, limit=2, order="desc")
    assert [i["id"] for i in desc["data"]] == ["4", "3"] and desc["has_more"] and desc["last_id"] == "3"
    rest = page(items, after="3", limit=10, order="desc")
    assert [i["id"] for i in rest["data"]] == ["2", "1", "0"] and not rest["has_more"]
    assert page(items, after="nope", limit=2, order="asc")["data"] == []
    assert page([], after=None, limit=2, order="asc")["first_id"] == ""


def _running(beat_at: float, lease_s: float = 1.0) -> StoredResponse:
    return StoredResponse(
        response=orjson.dumps({"status": "in_progress", "error": None}),
        request_id="r",
        beat_at=beat_at,
        lease_s=lease_s,
        events=[b"event: x\ndata: {}\n\n"],
    )


def test_a_background_record_is_stale_only_when_running_and_unrefreshed():
    assert not stale(_running(beat_at=100.0), now=103.0)
    assert stale(_running(beat_at=100.0), now=105.0)
    assert not stale(_running(beat_at=100.0, lease_s=0.0), now=1e9)  # not a background one
    assert not stale(ended(_running(beat_at=100.0), "cancelled"), now=1e9)
    failed = lost(_running(beat_at=100.0))
    assert not running(failed) and orjson.loads(failed.response)["error"]["message"] == BRIDGE_LOST
    assert b"response.failed" in failed.events[-1] and b'"sequence_number":1' in failed.events[-1]


def test_the_echo_is_asked_for_and_bounded():
    def request(text: str, echo: bool = True) -> GenerateRequest:
        return GenerateRequest(
            request_id="r",
            tenant="t",
            klass="c",
            model="m",
            reply_to="x",
            created_at=0,
            deadline=1,
            chat=ChatBody(model="m", messages=[Message(role="user", content=text)]),
            echo_input=echo,
        )

    assert orjson.loads(request("hi").echoed_input()) == [{"role": "user", "content": "hi"}]
    assert request("hi", echo=False).echoed_input() == b""
    assert request("x" * MAX_ECHO_BYTES).echoed_input() == b""


def test_a_streamed_background_response_keeps_its_last_events_within_the_bound():
    from bridge.responses.stored.background import Job
    from schemas.stored import MAX_STORED_EVENT_BYTES

    job = Job("t", None, None, 1, 0, lambda: None, lambda: None)
    event = b"event: response.output_text.delta\ndata: " + b"x" * 1000
    for _ in range(4):
        job.take_events(b"\n\n".join([event] * 100) + b"\n\n")
    assert job.event_bytes <= MAX_STORED_EVENT_BYTES and sum(map(len, job.events)) == job.event_bytes
    assert job.first_event + len(job.events) == 400 and job.first_event > 0
    assert all(e.endswith(b"\n\n") and e.startswith(b"event: ") for e in job.events)


def _asked() -> ResponsesBody:
    return ResponsesBody(
        model="m",
        input="hi",
        instructions="Mail a@b.c",
        user="a@b.c",
        tools=[ResponsesTool(type="function", name="f", description="for a@b.c")],
        text=TextConfig(
            format=TextFormat(type="json_schema", name="t", description="a@b.c", schema={"type": "object"})
        ),
        metadata={"who": "a@b.c"},
        safety_identifier="a@b.c",
        prompt_cache_key="a@b.c",
    )


def test_a_stored_response_repeats_the_request_only_as_the_gate_left_it():
    body = _asked()
    raw = {
        "instructions": body.instructions,
        "tools": [{"type": "function", "name": "f", "description": "for a@b.c"}],
        "tool_choice": "auto",
        "text": {"format": {"type": "json_schema", "description": "a@b.c"}},
        "user": body.user,
        "metadata": body.metadata,
        "safety_identifier": "a@b.c",
        "prompt_cache_key": "a@b.c",
    }
    withheld = stored_view(raw, body, b"", b"")  # nothing came back (yet): nothing of it is kept
    assert b"a@b.c" not in orjson.dumps(withheld) and withheld["metadata"] == {} and "user" not in withheld

    messages = orjson.dumps([{"role": "system", "content": "Mail <E>"}, {"role": "user", "content": "hi"}])
    fields = msgspec.json.encode(
        Echoed(
            tools=[Tool(function=FunctionDef(name="f", description="for <E>", strict=True))],
            response_format=ResponseFormat(
                type="json_schema", json_schema=JsonSchemaFormat(name="t", description="<E>", schema={"type": "object"})
            ),
            user="<E>",
            kept={"metadata": {"who": "<E>"}, "safety_identifier": "<E>", "prompt_cache_key": "<E>"},
        )
    )
    kept = stored_view(raw, body, messages, fields)
    assert b"a@b.c" not in orjson.dumps(kept)
    assert kept["instructions"] == "Mail <E>" and kept["user"] == "<E>" and kept["metadata"] == {"who": "<E>"}
    assert kept["tools"] == [{"type": "function", "name": "f", "description": "for <E>", "strict": True}]
    assert kept["text"]["format"]["description"] == "<E>" and kept["safety_identifier"] == "<E>"
    assert stored_view(raw, body, messages, b"not json")["metadata"] == {}  # an echo that does not read


def test_the_fields_no_engine_reads_ride_kept_and_come_back_in_the_echo():
    kept = kept_of(_asked())
    assert orjson.loads(kept) == {
        "metadata": {"who": "a@b.c"},
        "safety_identifier": "a@b.c",
        "prompt_cache_key": "a@b.c",
    }
    request = GenerateRequest(
        request_id="r",
        tenant="t",
        klass="c",
        model="m",
        reply_to="x",
        created_at=0,
        deadline=1,
        kept=kept,
        echo_input=True,
        chat=ChatBody(model="m", messages=[Message(role="user", content="hi")], user="u"),
    )
    assert orjson.loads(request.echoed()[1]) == {"user": "u", "kept": orjson.loads(kept)}
    long = ChatBody(model="m", messages=[Message(role="user", content="x" * (MAX_ECHO_BYTES - 40))], user="u" * 100)
    assert msgspec.structs.replace(request, chat=long).echoed()[1] == b""  # no room beside the messages: withheld
