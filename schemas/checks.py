"""The rules a request must keep that its types cannot express: the cross-field rules OpenAI's
API enforces on a body (`GenerateRequest.validate_shape` runs them), here; the model's context
and the deadline, which read the whole request, in `request_checks.py`. The bridge checks them
before it stores a request, and the broker again for every request it takes, since a direct
publisher never met the bridge."""

from __future__ import annotations

from schemas.errors import ErrorCode
from schemas.openai import Body, ChatBody, CompletionBody

MAX_TIMEOUT_S = 86_400.0  # the longest a request may live (x-laneway-timeout's bound)


class Invalid(ValueError):
    """A broken rule, with the OpenAI error it answers with."""

    def __init__(self, message: str, param: str | None, code: ErrorCode = ErrorCode.invalid_request) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def check_body(body: Body) -> None:
    if isinstance(body, ChatBody):
        check_chat(body)
    elif isinstance(body, CompletionBody):
        if body.best_of is not None and body.best_of < body.choices:
            raise Invalid("best_of must be at least n", "best_of")
    elif problem := body.check():
        raise Invalid(problem, "input")


def check_chat(body: ChatBody) -> None:
    names = body.tool_names()
    choice = body.tool_choice
    if choice is not None and choice != "none" and not body.tools:
        raise Invalid("tool_choice is only allowed when tools are specified", "tool_choice")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise Invalid(f"tool_choice names {choice.function.name!r}, which is not in tools", "tool_choice")
    if len(names) != len(body.tools or ()):
        raise Invalid("tool function names must be unique", "tools")
    if body.top_logprobs is not None and not body.logprobs:
        raise Invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.schema is None):
        raise Invalid("response_format json_schema needs json_schema.schema", "response_format.json_schema")
    for i, message in enumerate(body.messages):
        if message.role == "tool" and not message.tool_call_id:
            raise Invalid("a tool message needs the tool_call_id it answers", f"messages[{i}].tool_call_id")
        if message.tool_calls and message.role != "assistant":
            raise Invalid("only assistant messages carry tool_calls", f"messages[{i}].tool_calls")
