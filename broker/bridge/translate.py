"""An OpenAI body → `GenerateRequest`: the body travels whole. The edge checks only what the
types cannot (cross-field rules OpenAI itself enforces); engines honour or refuse the rest."""

from __future__ import annotations

import re

from broker.bridge.errors import EdgeError
from schemas.errors import ErrorCode
from schemas.openai import Body, ChatBody, CompletionBody
from schemas.requests import GenerateRequest

_PATH = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def param_of(validation_message: str) -> str | None:
    """msgspec names the failing field as `$.messages[0].role`; OpenAI's `param` is the path."""
    match = _PATH.search(validation_message)
    path = match.group(1) if match else ""
    missing = _MISSING.search(validation_message)
    if missing:     # the field that is missing, under the object that misses it
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def _invalid(message: str, param: str) -> EdgeError:
    return EdgeError(ErrorCode.invalid_request, message, param)


def check_chat(body: ChatBody) -> None:
    """The rules OpenAI's API enforces across fields."""
    names = body.tool_names()
    choice = body.tool_choice
    if choice is not None and choice != "none" and not body.tools:
        raise _invalid("tool_choice is only allowed when tools are specified", "tool_choice")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise _invalid(f"tool_choice names {choice.function.name!r}, which is not in tools", "tool_choice")
    if len(names) != len(body.tools or ()):
        raise _invalid("tool function names must be unique", "tools")
    if body.top_logprobs is not None and not body.logprobs:
        raise _invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.schema is None):
        raise _invalid("response_format json_schema needs json_schema.schema", "response_format.json_schema")
    for i, message in enumerate(body.messages):
        if message.role == "tool" and not message.tool_call_id:
            raise _invalid("a tool message needs the tool_call_id it answers", f"messages[{i}].tool_call_id")
        if message.tool_calls and message.role != "assistant":
            raise _invalid("only assistant messages carry tool_calls", f"messages[{i}].tool_calls")


def check_completion(body: CompletionBody) -> None:
    if body.best_of is not None and body.best_of < body.choices:
        raise _invalid("best_of must be at least n", "best_of")


def to_generate(body: Body, extra: bytes, *, request_id: str, tenant: str, klass: str,
                reply_to: str, now: float, deadline: float) -> GenerateRequest:
    chat = completion = embedding = None
    if isinstance(body, ChatBody):
        check_chat(body)
        chat = body
    elif isinstance(body, CompletionBody):
        check_completion(body)
        completion = body
    else:
        if problem := body.check():
            raise _invalid(problem, "input")
        embedding = body
    return GenerateRequest(request_id=request_id, tenant=tenant, klass=klass, model=body.model,
                           reply_to=reply_to, created_at=now, deadline=deadline, chat=chat,
                           completion=completion, embedding=embedding, extra=extra)


def check_context(generate: GenerateRequest, max_context_tokens: int) -> None:
    """Refuse, before anything is stored, a prompt that leaves the model no room to answer. The
    count is the estimate quotas use (~4 characters a token); engines check the exact count."""
    prompt = generate.estimated_prompt_tokens()
    field = "messages" if generate.chat is not None else "input" if generate.embedding else "prompt"
    if prompt >= max_context_tokens:
        raise EdgeError(ErrorCode.context_length_exceeded,
                        f"this model's context is {max_context_tokens} tokens; the {field} are about "
                        f"{prompt} tokens", field)
