"""`POST /v1/responses` translated: a Responses request becomes a `ChatBody` at the edge, so it
takes the chat path whole (lanes, quotas, PII, cache, metering, routing), and its entries are
rendered back in the Responses shape (`render_responses.py`). The stored history of a
`previous_response_id` or a `conversation` goes before the new input (`responses_api.py` fetches it).

What Laneway does not keep (item references, file ids) and non-function tools are refused with a
400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from bridge.errors import EdgeError
from schemas import codec
from schemas.errors import ErrorCode
from schemas.openai import (
    KNOWN_CHAT_FIELDS,
    ChatBody,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    Message,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
)
from schemas.responses import (
    KNOWN_RESPONSES_FIELDS,
    SERVABLE_INCLUDES,
    ContentPart,
    InputItem,
    ResponsesBody,
    ResponsesTool,
    TextConfig,
    ToolChoiceObject,
)

_decode = msgspec.json.Decoder(ResponsesBody).decode
_check_chat = msgspec.json.Decoder(ChatBody).decode
_NO_ITEMS = "Laneway keeps items only within their conversation or response"


def _invalid(message: str, param: str) -> EdgeError:
    return EdgeError(ErrorCode.invalid_request, message, param)


def decode_responses(raw: bytes) -> tuple[ResponsesBody, bytes]:
    """The typed body and its other top-level members (verbatim, for the engine)."""
    if codec.nests_deeper_than(raw, codec.MAX_JSON_DEPTH):
        raise codec.TooDeep(codec.MAX_JSON_DEPTH)
    body = _decode(raw)
    extra = codec.other_members(raw, KNOWN_RESPONSES_FIELDS)
    # Chat's own fields are not this endpoint's: in `extra` they would override the chat body
    # the gate checks (PII in messages, the slots n takes).
    if (name := next((k for k in codec.extra_members(extra) if k in KNOWN_CHAT_FIELDS), None)) is not None:
        raise _invalid(f"{name!r} is not a field of this endpoint", name)
    return body, extra


# -- refusals -------------------------------------------------------------------------------------
def _refuse_state(body: ResponsesBody) -> None:
    for value in body.include or ():
        if value not in SERVABLE_INCLUDES:
            raise _invalid(
                f"include value {value!r} is not supported; Laneway can include only {sorted(SERVABLE_INCLUDES)}",
                "include",
            )
    if body.truncation == "auto":
        raise _invalid(
            "truncation 'auto' is not supported: Laneway does not drop input items; use 'disabled'", "truncation"
        )
    reasoning = body.reasoning
    if reasoning is not None and (reasoning.summary or reasoning.generate_summary) not in (None, "auto"):
        raise _invalid(
            "reasoning summaries are not supported; leave reasoning.summary out or 'auto'", "reasoning.summary"
        )


# -- input ----------------------------------------------------------------------------------------
def _user_part(part: ContentPart, where: str) -> dict[str, Any]:
    if part.type in ("input_text", "output_text"):
        if part.text is None:
            raise _invalid("a text part needs its text", f"{where}.text")
        return {"type": "text", "text": part.text}
    if part.type == "input_image":
        if part.image_url is None:
            raise _invalid(
                "Laneway keeps no files: an input_image needs an image_url (a URL or a data URL), not a file_id",
                f"{where}.image_url",
            )
        return {"type": "image_url", "image_url": {"url": part.image_url, "detail": part.detail or "auto"}}
    if part.type == "input_file":
        if part.file_data is None:
            raise _invalid("Laneway keeps no files: an input_file needs its file_data", f"{where}.file_data")
        return {
            "type": "file",
            "file": {k: v for k, v in (("file_data", part.file_data), ("filename", part.filename)) if v is not None},
        }
    raise _invalid(f"content parts of type {part.type!r} are not supported here", f"{where}.type")


def _user_message(item: InputItem, where: str) -> Message:
    content, role = item.content, item.role
    if content is None:
        raise _invalid("a message needs content", f"{where}.content")
    assert role is not None  # _messages refused a message without one
    if isinstance(content, list):
        return Message(role=role, content=[_user_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)])
    return Message(role=role, content=content)


def _assistant_message(item: InputItem, where: str) -> Message:
    if isinstance(item.content, list):
        texts, refusals = [], []
        for j, part in enumerate(item.content):
            if part.type in ("output_text", "input_text") and part.text is not None:
                texts.append(part.text)
            elif part.type == "refusal" and part.refusal is not None:
                refusals.append(part.refusal)
            else:
                raise _invalid("an assistant message's parts are output_text or refusal", f"{where}.content[{j}].type")
        return Message(role="assistant", content="".join(texts) if texts else None, refusal="".join(refusals) or None)
    return Message(role="assistant", content=item.content)


def _tool_output(item: InputItem, where: str) -> Message:
    if not item.call_id:
        raise _invalid("a function_call_output needs the call_id it answers", f"{where}.call_id")
    output = item.output
    if output is None:
        raise _invalid("a function_call_output needs its output", f"{where}.output")
    if isinstance(output, list):
        parts = [_user_part(p, f"{where}.output[{j}]") for j, p in enumerate(output)]
        return Message(role="tool", tool_call_id=item.call_id, content=parts)
    return Message(role="tool", tool_call_id=item.call_id, content=output)


def conversation_id(body: ResponsesBody) -> str | None:
    conversation = body.conversation
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
        if not isinstance(conversation, str):
            raise _invalid("conversation is an id, or an object with its id", "conversation")
    return conversation


def item_messages(items: list[dict[str, Any]], field: str = "input") -> list[Message]:
    """Stored items as the chat messages they are to a model: a response's output (output items
    are valid input items: a message with output_text parts, function_call), a conversation's
    items; `field` names them in an error."""
    try:
        return _messages(msgspec.convert(items, list[InputItem]), field)
    except msgspec.ValidationError as exc:
        raise _invalid(f"an item is malformed: {exc}", field) from None


def _messages(items: str | list[InputItem] | None, field: str = "input") -> list[Message]:
    if items is None:
        return []
    if isinstance(items, str):
        return [Message(role="user", content=items)]
    out: list[Message] = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if item.type == "message":
            if item.role is None:
                raise _invalid("a message needs a role", f"{where}.role")
            if item.role == "assistant":
                out.append(_assistant_message(item, where))
            else:
                out.append(_user_message(item, where))
        elif item.type == "function_call":
            if not item.call_id or not item.name:
                missing = "name" if item.call_id else "call_id"
                raise _invalid(f"a function_call needs its {missing}", f"{where}.{missing}")
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments or ""))
            last = out[-1] if out else None
            # Calls the model made in one turn (after its text, if any) are one assistant message.
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or ()), call]
            else:
                out.append(Message(role="assistant", tool_calls=[call]))
        elif item.type == "function_call_output":
            out.append(_tool_output(item, where))
        elif item.type == "reasoning":
            continue  # a model's earlier thinking, replayed: chat models take none back
        elif item.type == "item_reference":
            raise _invalid(f"{_NO_ITEMS}: send the item itself", f"{where}.type")
        else:
            raise _invalid(f"input items of type {item.type!r} are not supported", f"{where}.type")
    return out


# -- tools and formats ----------------------------------------------------------------------------
def _tools(tools: list[ResponsesTool] | None) -> list[Tool]:
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise _invalid(
                f"tools of type {tool.type!r} are not supported: Laneway serves function tools only", f"tools[{i}].type"
            )
        if not tool.name:
            raise _invalid("a function tool needs a name", f"tools[{i}].name")
        # The Responses API enforces a function's schema unless `strict` is false (chat's
        # default is the opposite): say so explicitly to the engine.
        strict = True if tool.strict is None else tool.strict
        out.append(
            Tool(
                function=FunctionDef(
                    name=tool.name, description=tool.description, parameters=tool.parameters, strict=strict
                )
            )
        )
    return out


def _tool_choice(
    choice: Literal["none", "auto", "required"] | ToolChoiceObject | None, tools: list[Tool]
) -> tuple[ToolChoice | None, list[Tool]]:
    if choice is None or isinstance(choice, str):
        return choice, tools
    if choice.type == "function":
        if not choice.name:
            raise _invalid("a function tool_choice needs the function's name", "tool_choice.name")
        return NamedToolChoice(function=NamedFunction(name=choice.name)), tools
    if choice.type == "allowed_tools":
        names = set()
        for k, allowed in enumerate(choice.tools or ()):
            if allowed.get("type") != "function" or not isinstance(allowed.get("name"), str):
                raise _invalid("allowed_tools lists function tools by name", f"tool_choice.tools[{k}]")
            names.add(allowed["name"])
        unknown = names - {t.function.name for t in tools}
        if unknown:
            raise _invalid(f"allowed_tools names {sorted(unknown)}, which are not in tools", "tool_choice.tools")
        return choice.mode or "auto", [t for t in tools if t.function.name in names]
    raise _invalid(
        f"tool_choice of type {choice.type!r} is not supported: Laneway serves function tools only", "tool_choice.type"
    )


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.name is None:
        raise _invalid("a json_schema format needs a name", "text.format.name")
    if fmt.schema is None:
        raise _invalid("a json_schema format needs a schema", "text.format.schema")
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(name=fmt.name, schema=fmt.schema, description=fmt.description, strict=fmt.strict),
    )


def _with(extra: bytes, more: dict[str, Any]) -> bytes:
    if not more:
        return extra
    members: dict[str, Any] = dict(codec.extra_members(extra))
    members.update(more)
    return codec.encode_json(members)


def to_chat(body: ResponsesBody, extra: bytes, history: Sequence[Message] = ()) -> tuple[ChatBody, bytes]:
    """The chat body that asks the same of the model, and the extra members the engine gets.
    `history`: the stored conversation `previous_response_id` continues (its instructions are
    not carried over, as OpenAI's are not)."""
    _refuse_state(body)
    messages = (
        ([Message(role="system", content=body.instructions)] if body.instructions else [])
        + list(history)
        + _messages(body.input)
    )
    if not messages:
        raise _invalid("input is required (a string or a list of items)", "input")
    tool_choice, tools = _tool_choice(body.tool_choice, _tools(body.tools))
    logprobs = body.logprobs
    chat = ChatBody(
        model=body.model,
        stream=body.stream,
        messages=messages,
        temperature=body.temperature,
        top_p=body.top_p,
        user=body.user,
        max_completion_tokens=body.max_output_tokens,
        logprobs=True if logprobs else None,
        top_logprobs=body.top_logprobs if logprobs else None,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=_response_format(body.text),
    )
    try:  # the bounds a decoded chat body has (message count, parts): msgspec checks them on decode
        chat = _check_chat(codec.encode_json(chat))
    except msgspec.ValidationError as exc:
        raise _invalid(f"the request cannot be served as a chat: {exc}", "input") from None
    more: dict[str, Any] = {}
    if body.reasoning is not None and body.reasoning.effort is not None:
        more["reasoning_effort"] = body.reasoning.effort
    if body.text is not None and body.text.verbosity is not None:
        more["verbosity"] = body.text.verbosity
    return chat, _with(extra, more)
