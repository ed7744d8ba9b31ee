"""The `openai` engine's wire: the body it sends upstream and the SSE framing it reads back."""

from __future__ import annotations

import itertools
import json

import pytest

from schemas.frames import ToolCallDelta
from schemas.openai import ChatBody, CompletionBody, Message
from workers.engines import openai_wire as wire
from workers.engines.openai.sse import EventSplitter, EventTooLarge

CHAT = ChatBody(model="client", messages=[Message(role="user", content="hi")], max_tokens=5)


# -- the request body ----------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [b"", b"{}", b" { } ", b"\n"])
def test_no_extra_fields_leaves_the_typed_body(extra: bytes) -> None:
    assert json.loads(wire.encode_body(CHAT, "up", extra)) == {
        "model": "up",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }


def test_extra_members_are_spliced_as_bytes_and_a_client_cache_salt_dropped() -> None:
    sent = wire.encode_body(CHAT, "up", b'{"top_k": 4, "min_p":0.50}')
    assert sent.endswith(b',"top_k":4,"min_p":0.50}')  # values verbatim (0.50 stays 0.50)
    salted = json.loads(wire.encode_body(CHAT, "up", b'{"cache_salt":"mine","top_k":4}'))
    assert "cache_salt" not in salted and salted["top_k"] == 4
    only_salt = json.loads(wire.encode_body(CHAT, "up", b'{"cache_salt":"mine"}'))
    assert "cache_salt" not in only_salt
    with pytest.raises(ValueError):
        wire.encode_body(CHAT, "up", b"[1]")
    with pytest.raises(ValueError):  # a crafted extra cannot close the object and add members
        wire.encode_body(CHAT, "up", b'{"a":1},"model":"x","b":{}')
    owned = json.loads(wire.encode_body(CHAT, "up", b'{"model":"other","priority":-9,"top_k":1}'))
    assert owned["model"] == "up" and "priority" not in owned and owned["top_k"] == 1


def test_sampled_logprobs_are_asked_for_only_when_the_client_did_not() -> None:
    assert json.loads(wire.encode_body(CHAT, "up", sampled_logprobs=True))["logprobs"] is True
    completion = CompletionBody(model="c", prompt="p", max_tokens=3)
    assert json.loads(wire.encode_body(completion, "up", sampled_logprobs=True))["logprobs"] == 0
    asked = CompletionBody(model="c", prompt="p", logprobs=3)
    assert json.loads(wire.encode_body(asked, "up", sampled_logprobs=True))["logprobs"] == 3


def test_the_completions_default_output_limit_is_sent() -> None:
    sent = json.loads(wire.encode_body(CompletionBody(model="c", prompt="p"), "up", b'{"top_k":1}'))
    assert (sent["max_tokens"], sent["top_k"], wire.path_of(CompletionBody(model="c", prompt="p"))) == (
        16,
        1,
        "/completions",
    )


def test_legacy_function_call_deltas_and_finish_reasons() -> None:
    delta = wire.Delta(function_call=wire.FunctionDelta(name="f", arguments="{"))
    assert wire.tool_call_deltas(delta) == [ToolCallDelta(0, "", "f", "{")]
    assert [wire.finish_reason(r) for r in ("function_call", "tool_calls", None, "eos", "length")] == [
        "tool_calls",
        "tool_calls",
        "stop",
        "stop",
        "length",
    ]


# -- SSE framing ---------------------------------------------------------------------------------

STREAM = (
    b'\xef\xbb\xbf: keep-alive\r\n\r\ndata: {"a":1}\r\n\r\n\n\nevent: x\nid: 7\ndata: a\ndata:  b\n'
    b"retry: 5\n\ndata\n\ndata:[DONE]\r\r: bye\n\n"
)
EVENTS = [b'{"a":1}', b"a\n b", b"", b"[DONE]"]


def split_at(data: bytes, *cuts: int) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def run(reads: list[bytes]) -> list[bytes]:
    events = EventSplitter()
    out = [p for read in reads for p in events.feed(read)]
    tail = events.end()
    return out + ([tail] if tail is not None else [])


def test_one_read_gives_every_event() -> None:
    assert run([STREAM]) == EVENTS


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_events_split_anywhere_across_reads(cut: int) -> None:
    assert run(split_at(STREAM, cut)) == EVENTS


def test_byte_by_byte_reads_and_a_crlf_split_between_reads() -> None:
    assert run([STREAM[i : i + 1] for i in range(len(STREAM))]) == EVENTS
    # CR ending one read, LF opening the next: one line ending, not two (no early dispatch).
    assert run([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == [b"a\nb"]


def test_an_event_cut_short_is_returned_at_the_end() -> None:
    assert run([b"data: tail\n"]) == [b"tail"]
    assert run([b'data: {"x":']) == [b'{"x":']
    assert run([]) == []


def test_an_endless_event_is_refused() -> None:
    events = EventSplitter(limit=64)
    with pytest.raises(EventTooLarge):
        events.feed(b"data: " + b"x" * 100)
