"""Where a message carries text a model reads, as slots PII analysis fills and redaction writes
back: the content (a string, or every content part with a `text`, whatever its type: text,
input_text, refusal, ...), an assistant's refusal, and each tool call's arguments."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from schemas.openai import Message


@dataclass(frozen=True, slots=True)
class Slot:
    message: int            # index in the messages
    kind: str               # "content" | "part" | "refusal" | "arguments"
    index: int = 0          # the content part's, or the tool call's, index


def texts_of(messages: list[Message]) -> tuple[list[str], list[Slot]]:
    texts: list[str] = []
    slots: list[Slot] = []
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            texts.append(m.content)
            slots.append(Slot(i, "content"))
        elif m.content:
            for j, part in enumerate(m.content):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                    slots.append(Slot(i, "part", j))
        if m.refusal:
            texts.append(m.refusal)
            slots.append(Slot(i, "refusal"))
        for j, call in enumerate(m.tool_calls or ()):
            texts.append(call.function.arguments)
            slots.append(Slot(i, "arguments", j))
    return texts, slots


def written_back(messages: list[Message], slots: list[Slot], texts: list[str]) -> list[Message]:
    """`messages` with each slot's text replaced; unchanged messages are the same objects."""
    changed: dict[int, dict[Slot, str]] = {}
    for slot, text in zip(slots, texts):
        if text != _read(messages[slot.message], slot):
            changed.setdefault(slot.message, {})[slot] = text
    if not changed:
        return messages
    out = list(messages)
    for i, edits in changed.items():
        out[i] = _write(messages[i], edits)
    return out


def _read(m: Message, slot: Slot) -> str:
    if slot.kind == "content":
        return m.content  # type: ignore[return-value]
    if slot.kind == "part":
        return m.content[slot.index]["text"]  # type: ignore[index]
    if slot.kind == "refusal":
        return m.refusal  # type: ignore[return-value]
    return m.tool_calls[slot.index].function.arguments  # type: ignore[index]


def _write(m: Message, edits: dict[Slot, str]) -> Message:
    content, calls, refusal = m.content, m.tool_calls, m.refusal
    for slot, text in edits.items():
        if slot.kind == "content":
            content = text
        elif slot.kind == "refusal":
            refusal = text
        elif slot.kind == "part":
            content = list(content) if content is m.content else content  # type: ignore[arg-type]
            content[slot.index] = {**content[slot.index], "text": text}  # type: ignore[index]
        else:
            calls = list(calls) if calls is m.tool_calls else calls  # type: ignore[arg-type]
            call = calls[slot.index]  # type: ignore[index]
            calls[slot.index] = msgspec.structs.replace(  # type: ignore[index]
                call, function=msgspec.structs.replace(call.function, arguments=text))
    return msgspec.structs.replace(m, content=content, tool_calls=calls, refusal=refusal)
