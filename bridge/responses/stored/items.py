"""Chat messages (as the engine got them: redacted) → the Responses API's input items, as
`GET /v1/responses/{id}/input_items` lists them (OpenAI's `ItemResource` shapes), and the
list's paging. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import msgspec

from bridge.paging import window
from schemas.openai import Message

decode_messages = msgspec.json.Decoder(list[Message]).decode
MAX_PAGE = 100


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url") or {}
        return {"type": "input_image", "image_url": image.get("url"), "detail": image.get("detail", "auto")}
    if kind == "file":
        return {"type": "input_file", **(part.get("file") or {})}
    return {"type": "input_text", "text": part.get("text", "")}


def _content(message: Message) -> list[dict[str, Any]]:
    if isinstance(message.content, list):
        return [_input_part(p) for p in message.content]
    return [{"type": "input_text", "text": message.content or ""}]


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p.get("text"), str))
    return content or ""


def to_items(messages: list[Message], prefix: str, start: int = 0) -> list[dict[str, Any]]:
    """Each message as one item (an assistant's calls as function_call items after its text);
    ids `<kind>_<prefix>_<n>` from n = `start`, stable for one response (or conversation)."""
    items: list[dict[str, Any]] = []

    def add(kind: str, item: dict[str, Any]) -> None:
        items.append({"id": f"{kind}_{prefix}_{start + len(items)}", **item})

    for m in messages:
        if m.role == "assistant":
            if m.content or m.refusal:
                text = {"type": "output_text", "text": _text(m.content), "annotations": [], "logprobs": []}
                parts = [text] if m.content else []
                if m.refusal:
                    parts.append({"type": "refusal", "refusal": m.refusal})
                add("msg", {"type": "message", "role": "assistant", "status": "completed", "content": parts})
            for call in m.tool_calls or ():
                add(
                    "fc",
                    {
                        "type": "function_call",
                        "status": "completed",
                        "call_id": call.id,
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    },
                )
        elif m.role == "tool":
            add(
                "fco",
                {
                    "type": "function_call_output",
                    "status": "completed",
                    "call_id": m.tool_call_id or "",
                    "output": _text(m.content),
                },
            )
        else:
            add("msg", {"type": "message", "role": m.role, "status": "completed", "content": _content(m)})
    return items


def page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """OpenAI's `ResponseItemList`: `order` asc (as given) or desc, the items after the id
    `after` in that order, at most `limit`."""
    data, more = window(items, [i["id"] for i in items], after, limit, order)
    return {
        "object": "list",
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else "",
        "last_id": data[-1]["id"] if data else "",
    }
