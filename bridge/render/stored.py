"""What a stored Response repeats of its request: only what the tenant's PII policy let through.

A Response object repeats the request's texts (`instructions`, `tools`, `tool_choice`,
`text.format`, `user`, `metadata`, `safety_identifier`, `prompt_cache_key`). The client's own
answer carries them as sent; what is stored (and `ops` may read) carries them as the broker's
gate left them, as the input items are. Each comes back from the engine's side on the Finished
entry: the instructions as the first echoed message, the chat's tools, tool choice, response
format and `user` in `Finished.fields`, and the fields no engine reads (`metadata`,
`safety_identifier`, `prompt_cache_key`) in `GenerateRequest.kept`, which the gate analyses
like the prompt and `Finished.fields` echoes. Before the end (a background response queued or
running) and when nothing came back (an echo over its bound), each is withheld: empty, never raw.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import codec
from schemas.openai import Message
from schemas.requests import Echoed
from schemas.responses import ResponsesBody

_decode_echoed = msgspec.json.Decoder(Echoed).decode
_decode_first = msgspec.json.Decoder(list[Message]).decode
KEPT_FIELDS = ("metadata", "safety_identifier", "prompt_cache_key")  # stored, never given to an engine
WITHHELD_SCHEMA = {"type": "json_schema", "name": "withheld", "schema": {}}


def _read(decode: Any, echoed: bytes) -> Any:
    """An echo as it decodes; nothing (withheld) when there is none or it does not read."""
    try:
        return decode(echoed) if echoed else None
    except msgspec.DecodeError:
        return None


def kept_of(body: ResponsesBody) -> bytes:
    """`GenerateRequest.kept` for this body: its fields that are stored and no engine reads."""
    kept = {name: value for name in KEPT_FIELDS if (value := getattr(body, name)) is not None}
    return codec.encode_json(kept) if kept else b""


def _tool_choice(body: ResponsesBody, echoed: Echoed | None) -> Any:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    if echoed is None:  # its names withheld: what it asks, without them
        return "required" if choice.type == "function" else choice.mode or "auto"
    if choice.type == "function" and not isinstance(echoed.tool_choice, str) and echoed.tool_choice is not None:
        return {"type": "function", "name": echoed.tool_choice.function.name}
    return {
        "type": "allowed_tools",
        "mode": choice.mode or "auto",
        "tools": [{"type": "function", "name": t.function.name} for t in echoed.tools or ()],
    }


def _format(body: ResponsesBody, echoed: Echoed | None) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None  # text and json_object carry no text of the client's
    schema = echoed.response_format.json_schema if echoed is not None and echoed.response_format else None
    return {"type": "json_schema", **msgspec.to_builtins(schema)} if schema is not None else dict(WITHHELD_SCHEMA)


def stored_view(response: dict[str, Any], body: ResponsesBody, messages: bytes, fields: bytes) -> dict[str, Any]:
    """`response` with every text it repeats of the request as the gate left it (`messages`,
    `fields`: the Finished entry's), or withheld where none came back."""
    out = dict(response)
    first = (_read(_decode_first, messages) or [])[:1] if body.instructions else []
    echoed = _read(_decode_echoed, fields)
    instructions = first[0].content if first and first[0].role == "system" else None
    out["instructions"] = instructions if isinstance(instructions, str) else None
    out["tools"] = (
        [{"type": "function", **msgspec.to_builtins(t.function)} for t in echoed.tools or ()]
        if echoed is not None
        else []
    )
    out["tool_choice"] = _tool_choice(body, echoed)
    if (fmt := _format(body, echoed)) is not None:
        out["text"] = {**response["text"], "format": fmt}
    out.pop("user", None)
    if echoed is not None and echoed.user is not None:
        out["user"] = echoed.user
    kept = echoed.kept if echoed is not None and echoed.kept is not None else {}
    out["metadata"] = kept.get("metadata") or {}
    out["safety_identifier"] = kept.get("safety_identifier")
    out["prompt_cache_key"] = kept.get("prompt_cache_key")
    return out
