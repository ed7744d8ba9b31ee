"""Which texts of a request the PII stage analyses (`slots.py`), and how redacted text is written
back (`edit.py`): pure, no analyser."""

from __future__ import annotations

import json

import msgspec
import pytest

from broker.gate.pii.edit import edited, edited_extra, split
from broker.gate.pii.redact import Replacer, apply
from broker.gate.pii.slots import FIELDS, NOT_TEXT, Slot, collect
from core.policy.pii import Action
from schemas import codec
from schemas.openai import ChatBody, CompletionBody, EmbeddingBody, Message
from schemas.openai_extra import NAMED


def test_every_field_of_the_typed_bodies_is_a_slot_or_declared_textless() -> None:
    """A field added to a body must say how it reaches the engine, or the gate never reads it."""
    for struct, how in FIELDS.items():
        names = {f.name for f in msgspec.structs.fields(struct)}
        assert not set(how) & NOT_TEXT[struct], struct
        assert set(how) | NOT_TEXT[struct] == names, f"{struct.__name__}: {names - set(how) - NOT_TEXT[struct]}"
    assert set(NOT_TEXT) == set(FIELDS)


CHAT = msgspec.convert(
    {
        "model": "m",
        "user": "u-email",
        "stop": ["s0", "s1"],
        "logit_bias": {"123": 1},
        "messages": [
            {
                "role": "user",
                "name": "who",
                "content": [{"type": "text", "text": "hello"}, {"type": "refusal", "refusal": "no"}],
            },
            {
                "role": "assistant",
                "refusal": "nope",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "result"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "look",
                    "description": "Looks",
                    "parameters": {"type": "object", "properties": {"q": {"enum": ["x"]}}},
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "description": "d", "schema": {"title": "t"}},
        },
    },
    ChatBody,
)


def slots_by_text(found) -> dict[str, list[Slot]]:
    out: dict[str, list[Slot]] = {}
    for text, slot in zip(found.texts, found.slots, strict=True):
        out.setdefault(text, []).append(slot)
    return out


def test_a_chat_is_read_everywhere_a_model_reads_text() -> None:
    extra = {"prediction": {"type": "content", "content": "guess"}, "frobnicate": ["odd"]}
    found = collect(CHAT, extra)
    by_text = slots_by_text(found)
    params = {text: {s.param for s in slots} for text, slots in by_text.items()}
    assert params["who"] == {"messages[0].name"}
    assert params["hello"] == {"messages[0].content[0]"} and params["no"] == {"messages[0].content[1]"}
    assert params["nope"] == {"messages[1].refusal"} and params["result"] == {"messages[2].content"}
    assert params["call_1"] == {"messages[1].tool_calls[0].id", "messages[2].tool_call_id"}
    assert params["look"] == {
        "messages[1].tool_calls[0].function.name",
        "tools[0].function.name",
        "tool_choice.function.name",
    }
    assert params["{}"] == {"messages[1].tool_calls[0].function.arguments"}
    assert params["Looks"] == {"tools[0].function.description"}
    # A schema is read whole, keys too, and named by its root (a key may be the client's text).
    assert {"type", "object", "properties", "q", "enum", "x"} <= set(params)
    assert params["q"] == params["x"] == {"tools[0].function.parameters"}
    assert params["r"] == {"response_format.json_schema.name"}
    assert params["d"] == {"response_format.json_schema.description"}
    assert params["title"] == params["t"] == {"response_format.json_schema.schema"}
    assert params["s1"] == {"stop[1]"} and params["u-email"] == {"user"} and params["123"] == {"logit_bias"}
    # Extra: our names name the field; any other name is the client's text, analysed, called "extra".
    assert params["guess"] == {"prediction"} and "prediction" not in params
    assert params["frobnicate"] == params["odd"] == {"extra"}
    # Identifiers are redacted name-safe; the role, the model, the tool's type are not text.
    assert all(s.name for s in by_text["look"] + by_text["call_1"] + by_text["who"] + by_text["r"])
    assert not any(s.name for s in by_text["hello"] + by_text["Looks"])
    assert not {"m", "user", "assistant", "tool", "function", "json_schema"} & set(params)
    assert found.unreadable == []


def test_completion_and_embedding_texts() -> None:
    found = collect(CompletionBody(model="m", prompt=["p"], suffix="sfx", user="u"), {})
    assert [(t, s.param) for t, s in zip(found.texts, found.slots, strict=True)] == [
        ("p", "prompt[0]"),
        ("sfx", "suffix"),
        ("u", "user"),
    ]
    found = collect(EmbeddingBody(model="m", input=["a", "b"]), {})
    assert [(t, s.param, s.first_index) for t, s in zip(found.texts, found.slots, strict=True)] == [
        ("a", "input[0]", 0),
        ("b", "input[1]", 1),
    ]
    assert collect(EmbeddingBody(model="m", input=[1, 2, 3]), {}).texts == []


@pytest.mark.parametrize(
    "part, what",
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "'image_url' content"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "'input_audio' content"),
        ({"type": "file", "file": {"file_data": "AAAA"}}, "'file' content"),
        ({"type": "video_url", "video_url": {"url": "x"}}, "'video_url' content"),
        ({"image_url": "https://example.com/a.png"}, "an untyped content part"),  # vLLM reads it by its key
    ],
)
def test_parts_no_analyser_reads_are_unreadable(part, what) -> None:
    body = ChatBody(model="m", messages=[Message("user", [{"type": "text", "text": "see"}, part])])
    found = collect(body, {})
    assert found.texts == ["see"]
    ((slot, said, instead),) = found.unreadable
    assert slot.param == "messages[0].content[1]" and said == what
    assert instead == ({"type": part["type"]} if "type" in part else {})  # what a kept copy holds


def test_a_bare_text_part_is_text() -> None:
    found = collect(ChatBody(model="m", messages=[Message("user", [{"text": "bare"}])]), {})
    assert found.texts == ["bare"] and not found.unreadable


def redact(found, needle: str, replacement: str) -> list[tuple[Slot, str]]:
    return [
        (slot, text.replace(needle, replacement))
        for text, slot in zip(found.texts, found.slots, strict=True)
        if needle in text
    ]


def test_write_back_copies_only_along_the_edited_paths() -> None:
    body = ChatBody(
        model="m", messages=[Message("system", "fixed"), Message("user", "mail a@b.c now")], tools=CHAT.tools
    )
    body_edits, extra_edits, _ = split(redact(collect(body, {}), "a@b.c", "<EMAIL_ADDRESS>"))
    assert extra_edits == []
    out = edited(body, body_edits, [])
    assert out.messages[1].content == "mail <EMAIL_ADDRESS> now" and body.messages[1].content == "mail a@b.c now"
    assert out.messages[0] is body.messages[0] and out.tools is body.tools


def test_keys_and_values_under_them_are_rewritten_together() -> None:
    schema = {"type": "object", "properties": {"a@b.c": {"description": "mail a@b.c"}}, "required": ["a@b.c"]}
    body = msgspec.convert(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"function": {"name": "f", "parameters": schema}}],
        },
        ChatBody,
    )
    clashes: list[Slot] = []
    out = edited(body, split(redact(collect(body, {}), "a@b.c", "<E>"))[0], clashes)
    assert out.tools[0].function.parameters == {
        "type": "object",
        "properties": {"<E>": {"description": "mail <E>"}},
        "required": ["<E>"],
    }
    assert clashes == [] and "a@b.c" in json.dumps(schema)


def test_two_keys_that_read_the_same_once_redacted_are_a_clash() -> None:
    raw = dict(codec.extra_members(b'{"metadata":{"a@b.c":"1","d@e.f":"2"},"top_k": 5.50}'))
    decoded = {k: msgspec.json.decode(v) for k, v in raw.items()}
    found = collect(ChatBody(model="m", messages=[Message("user", "hi")]), decoded)
    edits = [(s, "<E>") for t, s in zip(found.texts, found.slots, strict=True) if "@" in t]
    clashes: list[Slot] = []
    extra = edited_extra(raw, decoded, split(edits)[1], clashes)
    assert [c.param for c in clashes] == ["metadata"]
    assert b'"top_k":5.50' in extra  # an untouched member keeps the client's spelling


def test_identifiers_get_a_name_safe_replacement() -> None:
    replace = Replacer(b"k", "acme")
    spans = [(7, 17, "PHONE_NUMBER", Action.redact)]
    assert apply("notify_4155550132", spans, replace.name) == "notify_PHONE_NUMBER"
    assert apply("notify_4155550132", [(7, 17, "PHONE_NUMBER", Action.mask)], replace.name) == "notify_PHONE_NUMBER"
    hashed = apply("notify_4155550132", [(7, 17, "PHONE_NUMBER", Action.hash)], replace.name)
    assert hashed.startswith("notify_PHONE_NUMBER_") and hashed.replace("_", "").isalnum()
    # The same pseudonym as in text, without the brackets: one value, one name, wherever it is.
    assert replace("PHONE_NUMBER", "4155550132", Action.hash) == f"<{hashed.removeprefix('notify_')}>"


def test_our_extra_names_are_no_client_text() -> None:
    assert all(n.isidentifier() and n.islower() for n in NAMED)
