"""The OpenAI response objects the edge writes: chat completions, text completions, models, errors.
Streamed chunks are rendered from byte templates in `bridge/render/sse.py`; these are the
non-streamed bodies and the shapes the OpenAPI document at `/openapi.json` describes."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.openai import ToolCall


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0  # of prompt_tokens, read from the engine's prefix cache


class CompletionUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=PromptTokensDetails)


class ChoiceMessage(msgspec.Struct):
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET
    role: str = "assistant"


class ChoiceLogprobs(msgspec.Struct):
    content: list[dict[str, Any]] | None
    refusal: list[dict[str, Any]] | None = None


class Choice(msgspec.Struct):
    index: int
    message: ChoiceMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
    object: str = "chat.completion"


class TextLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class TextChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str
    logprobs: TextLogprobs | None = None


class TextCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
    object: str = "text_completion"


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "laneway"
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody
