"""Wire shapes of the OpenAI-compatible streaming API, as the `openai` engine reads them.

Lenient on purpose: upstreams differ in the fields they add or omit.
"""

from __future__ import annotations

import msgspec

from schemas.requests import ChatMessage


class StreamOptions(msgspec.Struct):
    include_usage: bool = True


class Body(msgspec.Struct, omit_defaults=True):
    model: str
    stream: bool                             # no defaults here: omit_defaults would drop them
    stream_options: StreamOptions
    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None


class Delta(msgspec.Struct):
    content: str | None = None


class Choice(msgspec.Struct):
    index: int = 0
    delta: Delta | None = None              # chat/completions
    text: str | None = None                  # completions
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ErrorBody(msgspec.Struct):
    message: str = ""
    param: str | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: ErrorBody | None = None          # in-band error after the stream started (vLLM)


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody | None = None
    message: str | None = None               # older vLLM puts the error at the top level
    param: str | None = None


encode = msgspec.json.Encoder().encode
decode_chunk = msgspec.json.Decoder(Chunk).decode
decode_error = msgspec.json.Decoder(ErrorEnvelope).decode
DONE = object()                             # the `data: [DONE]` event
