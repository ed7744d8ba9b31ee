"""The SSE framing the `openai` engine reads: byte lines in, one `data:` payload per event out."""

from __future__ import annotations

from workers.engines.openai.sse import DataEvents


def events(*lines: bytes) -> list[bytes | None]:
    parser = DataEvents()
    out = [p for line in lines if (p := parser.feed(line)) is not None]
    return [*out, parser.end()]


def test_one_payload_per_event_with_crlf_and_one_space_dropped() -> None:
    assert events(b'data: {"a":1}\r\n', b"\r\n", b"data:[DONE]\n", b"\n") == [b'{"a":1}', b"[DONE]", None]


def test_multi_line_data_joined_and_other_fields_ignored() -> None:
    assert events(
        b": keep-alive\n", b"\n", b"event: x\n", b"id: 7\n", b"data: a\n", b"data:  b\n", b"retry: 5\n", b"\n"
    ) == [b"a\n b", None]


def test_an_event_cut_short_by_the_end_of_the_stream_is_still_returned() -> None:
    assert events(b"data: tail\n") == [b"tail"]
    assert events() == [None]
