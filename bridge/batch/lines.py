"""A batch's input file, line by line, and its output lines: OpenAI's JSONL formats. Pure.

Input: one JSON object per line, `{"custom_id", "method": "POST", "url", "body"}`; every line
names the batch's endpoint, custom ids are unique, at most `MAX_LINES` lines. Problems are
collected (with their line numbers, 1-based as OpenAI reports them), not raised one at a time:
the batch fails at validation naming them all, up to a bound.

Output: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`; a line
never executed (expired, cancelled) has `response: null` and an `error` object.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from schemas.batches import BatchError

MAX_LINES = 50_000  # OpenAI's limit per batch
MAX_ERRORS = 100  # reported of a failed validation


class InputLine(msgspec.Struct, forbid_unknown_fields=True):
    custom_id: Annotated[str, Meta(min_length=1, max_length=512)]
    method: str
    url: str
    body: msgspec.Raw


_decode_line = msgspec.json.Decoder(InputLine).decode


def parse(content: bytes, endpoint: str) -> tuple[list[InputLine], list[BatchError]]:
    """The lines of an input file, or the problems that make it one no batch can run."""
    lines: list[InputLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    raw_lines = [raw for raw in content.split(b"\n") if raw.strip()]
    if len(raw_lines) > MAX_LINES:
        return [], [
            BatchError(
                "too_many_requests", f"the file has {len(raw_lines)} requests; a batch holds at most {MAX_LINES}"
            )
        ]
    if not raw_lines:
        return [], [BatchError("empty_file", "the input file has no requests")]
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = _decode_line(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            errors.append(BatchError("invalid_json_line", f"not a valid request line: {exc}", line=number))
            continue
        if line.method != "POST":
            errors.append(BatchError("invalid_request", "method must be 'POST'", "method", number))
        elif line.url != endpoint:
            errors.append(
                BatchError(
                    "mismatched_endpoint",
                    f"the line's url {line.url!r} is not the batch's endpoint {endpoint!r}",
                    "url",
                    number,
                )
            )
        elif line.custom_id in seen:
            errors.append(
                BatchError("duplicate_custom_id", f"custom_id {line.custom_id!r} appears twice", "custom_id", number)
            )
        elif not bytes(line.body).lstrip().startswith(b"{"):
            errors.append(BatchError("invalid_request", "body must be a JSON object", "body", number))
        else:
            seen.add(line.custom_id)
            lines.append(line)
        if len(errors) >= MAX_ERRORS:
            break
    return lines, errors


def _line_id() -> str:
    return f"batch_req_{uuid.uuid4().hex[:24]}"


def answered(custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """An executed line: its HTTP status and body as the endpoint answered it."""
    return msgspec.json.encode(
        {
            "id": _line_id(),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": msgspec.Raw(body)},
            "error": None,
        }
    )


def not_executed(custom_id: str, code: str, message: str) -> bytes:
    return msgspec.json.encode(
        {"id": _line_id(), "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}
    )


EXPIRED = ("batch_expired", "This request could not be executed before the completion window expired.")
CANCELLED = ("batch_cancelled", "This request was not executed: the batch was cancelled.")


_CHAT_USAGE = ("prompt_tokens", "completion_tokens", "prompt_tokens_details")
_RESPONSE_USAGE = ("input_tokens", "output_tokens", "input_tokens_details")


def usage_of(body: bytes) -> tuple[int, int, int]:
    """(input, output, cached) tokens of an endpoint's answer body, 0 where it has none: chat's and
    completions' `prompt_tokens`..., or a Response's `input_tokens`..."""
    try:
        usage: Any = msgspec.json.decode(body).get("usage") or {}
    except (msgspec.DecodeError, AttributeError):
        return 0, 0, 0
    names = _RESPONSE_USAGE if "input_tokens" in usage else _CHAT_USAGE
    details = usage.get(names[2]) or {}
    return int(usage.get(names[0]) or 0), int(usage.get(names[1]) or 0), int(details.get("cached_tokens") or 0)
