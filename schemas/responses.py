"""`POST /v1/responses` (OpenAI's Responses API, stateless) as the edge reads it: typed where the
edge translates a field into a chat body or refuses it, every other top-level field kept
verbatim for the engine (as `schemas/openai.py` does for chat).

Items and parts are flat structs with a string `type`: a client's easy message may leave `type`
out, and a type Laneway does not serve is refused by name (`input[2].type`) at translation, not
as a decoding error. Nothing here travels on NATS: the edge turns it into a `ChatBody`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.openai import MAX_OUTPUT_TOKENS, MAX_TOP_LOGPROBS, ToolName

MAX_INPUT_ITEMS = 1024
# What `include` may ask for that a stateless broker can serve.
SERVABLE_INCLUDES = frozenset({"message.output_text.logprobs"})


class ContentPart(msgspec.Struct, omit_defaults=True):
    """input_text, input_image, input_file (a user's), output_text, refusal (an assistant's)."""

    type: str
    text: str | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    refusal: str | None = None


class InputItem(msgspec.Struct, omit_defaults=True):
    """A message (`type` may be left out), a `function_call` the model made, or the
    `function_call_output` answering it; other item types are refused by name."""

    type: str = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[ContentPart] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None


class ResponsesTool(msgspec.Struct, omit_defaults=True):
    """The flat function tool ({type, name, description, parameters, strict}); any other `type`
    (web_search, file_search, ...) is refused as `tools[i].type`."""

    type: str
    name: ToolName | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceObject(msgspec.Struct, omit_defaults=True):
    """{"type": "function", "name": ...}, or {"type": "allowed_tools", "mode", "tools"}."""

    type: str
    name: str | None = None
    mode: Literal["auto", "required"] | None = None
    tools: list[dict[str, Any]] | None = None


class TextFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}\Z")] | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(msgspec.Struct, omit_defaults=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesBody(msgspec.Struct, omit_defaults=True, kw_only=True):
    """`POST /v1/responses`. `store` absent means false: Laneway keeps no responses."""

    model: Annotated[str, Meta(min_length=1, max_length=128)]
    input: str | Annotated[list[InputItem], Meta(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    include: list[str] | None = None
    tools: Annotated[list[ResponsesTool], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Neutral: accepted, echoed in the Response, not sent to the engine.
    metadata: Annotated[dict[str, Annotated[str, Meta(max_length=512)]], Meta(max_length=16)] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or ())


KNOWN_RESPONSES_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(ResponsesBody))
