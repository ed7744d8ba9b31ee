"""A batch's input file read line by line (OpenAI's rules, every problem with its line number),
and its output lines in OpenAI's format."""

from __future__ import annotations

import json

from bridge.batch import lines
from bridge.batch.api import window_s
from bridge.errors import EdgeError

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", url: str = CHAT, method: str = "POST", body: object | None = None) -> bytes:
    return json.dumps(
        {"custom_id": custom_id, "method": method, "url": url, "body": {"model": "m"} if body is None else body}
    ).encode()


def test_good_lines_are_read_in_order_blank_lines_skipped() -> None:
    found, errors = lines.parse(line("a") + b"\n\n" + line("b") + b"\n", CHAT)
    assert errors == [] and [x.custom_id for x in found] == ["a", "b"]
    assert json.loads(bytes(found[0].body)) == {"model": "m"}


def test_every_problem_is_named_with_its_line() -> None:
    content = b"\n".join(
        [
            line("a"),
            line("a"),
            b"{not json",
            line("c", url="/v1/embeddings"),
            line("d", method="GET"),
            line("e", body=[1]),
            json.dumps({"custom_id": "f"}).encode(),
        ]
    )
    found, errors = lines.parse(content, CHAT)
    assert [(e.code, e.line) for e in errors] == [
        ("duplicate_custom_id", 2),
        ("invalid_json_line", 3),
        ("mismatched_endpoint", 4),
        ("invalid_request", 5),
        ("invalid_request", 6),
        ("invalid_json_line", 7),
    ]
    assert [x.custom_id for x in found] == ["a"]


def test_an_empty_or_too_long_file_fails_whole() -> None:
    assert lines.parse(b"\n \n", CHAT)[1][0].code == "empty_file"
    many = b"\n".join(line(str(i)) for i in range(lines.MAX_LINES + 1))
    assert lines.parse(many, CHAT)[1][0].code == "too_many_requests"


def test_output_lines_are_openai_shaped() -> None:
    ok = json.loads(lines.answered("a", 200, "req-1", b'{"id":"x","usage":{"prompt_tokens":3}}'))
    assert ok["custom_id"] == "a" and ok["error"] is None and ok["id"].startswith("batch_req_")
    assert ok["response"] == {
        "status_code": 200,
        "request_id": "req-1",
        "body": {"id": "x", "usage": {"prompt_tokens": 3}},
    }
    gone = json.loads(lines.not_executed("b", *lines.EXPIRED))
    assert gone["response"] is None and gone["error"]["code"] == "batch_expired"
    assert lines.usage_of(
        b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}'
    ) == (3, 4, 2)
    assert lines.usage_of(b'{"error":{}}') == (0, 0, 0) and lines.usage_of(b"not json") == (0, 0, 0)


def test_a_responses_line_is_metered_by_its_response_usage() -> None:
    response = (
        b'{"object":"response","usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12,'
        b'"input_tokens_details":{"cached_tokens":3},"output_tokens_details":{"reasoning_tokens":0}}}'
    )
    assert lines.usage_of(response) == (5, 7, 3)
    found, errors = lines.parse(line("r", url="/v1/responses", body={"model": "m", "input": "hi"}), "/v1/responses")
    assert errors == [] and [x.custom_id for x in found] == ["r"]


def test_completion_windows() -> None:
    assert window_s("24h") == 86_400 and window_s("30m") == 1_800
    for bad in ("25h", "0h", "1d", "", "24 h"):
        try:
            window_s(bad)
        except EdgeError as exc:
            assert exc.param == "completion_window"
        else:
            raise AssertionError(bad)
