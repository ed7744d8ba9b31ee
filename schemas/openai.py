"""The HTTP edge's shapes: OpenAI chat completion request, response, chunk and error objects."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.requests import MAX_OUTPUT_TOKENS, MAX_STOP_SEQUENCES, Seed


class EdgeMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    # OpenAI also allows a list of content parts; text parts are joined, others refused.
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct, omit_defaults=True):
    """Fields we honour; the other OpenAI fields are accepted only at their neutral values."""

    model: Annotated[str, Meta(min_length=1, max_length=128)]
    messages: Annotated[list[EdgeMessage], Meta(min_length=1, max_length=1024)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: Seed | None = None
    n: Annotated[int, Meta(ge=1, le=1)] | None = None
    user: str | None = None
    # Accepted and ignored at their defaults only; see bridge/translate.py.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


class ChoiceMessage(msgspec.Struct):
    role: str
    content: str


class CompletionUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(msgspec.Struct):
    index: int
    message: ChoiceMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    object: str = "chat.completion"


class ChunkDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    object: str = "chat.completion.chunk"


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
