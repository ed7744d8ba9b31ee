"""The OpenAI request bodies as they travel through Laneway: typed where Laneway reads a field
(admission, PII, quotas, cache, routing), every other top-level field kept verbatim beside them
(`GenerateRequest.extra`) so it reaches the engine untouched.

Bounds here are the OpenAI API's own (n ≤ 128 there; Laneway takes n ≤ 8, each choice a sequence
slot). Engines refuse, naming the field, what they cannot honour.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import Meta

MAX_OUTPUT_TOKENS = 1 << 20  # a wire ceiling only; each model's context is the real limit
MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 8
MAX_TOP_LOGPROBS = 20

# msgpack carries at most a 64-bit integer, and engines seed a 64-bit generator.
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
MaxTokens = Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Stop = str | Annotated[list[str], Meta(max_length=MAX_STOP_SEQUENCES)]
ToolName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:-]{1,64}\Z")]


class FunctionCall(msgspec.Struct, omit_defaults=True, gc=False):
    name: str
    arguments: str = ""  # a JSON text, as the model wrote it


# `type` has a default for lenient reading, but is always written: OpenAI requires it.
class ToolCall(msgspec.Struct, gc=False):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Message(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    # A string, or OpenAI content parts ({"type": "text", "text": ...}, image_url, ...), verbatim.
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, in the history
    tool_call_id: str | None = None  # a tool result answers this call
    refusal: str | None = None

    def texts(self) -> list[str]:
        """Every piece of text this message puts before the model: its content's text (every
        part with a `text`), its refusal, and its tool calls' arguments (what PII analysis, the
        classifier and estimates read)."""
        out: list[str] = []
        if isinstance(self.content, str):
            out.append(self.content)
        elif self.content:
            out.extend(p["text"] for p in self.content if isinstance(p.get("text"), str))
        if self.refusal:
            out.append(self.refusal)
        for call in self.tool_calls or ():
            out.append(call.function.arguments)
        return out

    @property
    def text(self) -> str:
        return "".join(self.texts())

    def has_parts(self, kind: str) -> bool:
        return isinstance(self.content, list) and any(p.get("type") == kind for p in self.content)


class FunctionDef(msgspec.Struct, omit_defaults=True):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(msgspec.Struct, omit_defaults=True):
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}\Z")]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class Sampling(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The sampling fields chat and completions share."""

    model: Annotated[str, Meta(min_length=1, max_length=128)]
    stream: bool | None = False  # null is "not set", as for every OpenAI field
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    @property
    def deterministic(self) -> bool:
        """Whether the answer is a function of the request: what the response cache may keep."""
        return self.temperature == 0.0 or self.seed is not None


class ChatBody(Sampling, kw_only=True):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[Message], Meta(min_length=1, max_length=1024)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    @property
    def output_limit(self) -> int | None:
        """The client's limit on generated tokens; None: up to the model's context."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    def texts(self) -> list[str]:
        return [t for m in self.messages for t in m.texts()]

    def tool_names(self) -> set[str]:
        return {t.function.name for t in self.tools or ()}


class CompletionBody(Sampling, kw_only=True):
    """`POST /v1/completions` (legacy text completion). One text prompt, as a string or a
    one-element list; `n` gives several choices for it."""

    prompt: str | Annotated[list[str], Meta(min_length=1, max_length=1)]
    max_tokens: MaxTokens | None = 16  # the OpenAI API's default for this endpoint
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None  # 0: the sampled token's logprob only

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def texts(self) -> list[str]:
        return [self.text] + ([self.suffix] if self.suffix else [])


MAX_EMBEDDING_INPUTS = 2048  # the OpenAI API's own limit per request


class EmbeddingBody(msgspec.Struct, omit_defaults=True, kw_only=True):
    """`POST /v1/embeddings`: one vector per input text (or token-id list)."""

    model: Annotated[str, Meta(min_length=1, max_length=128)]
    # A text, or a list of texts, of token ids (one input), or of token-id lists; msgspec takes
    # one array type per union, so `check()` refuses mixed lists.
    input: str | Annotated[list[str | int | list[int]], Meta(min_length=1, max_length=1 << 20)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=65_536)] | None = None
    user: str | None = None

    # What the Sampling fields answer for generation bodies.
    stream = False
    stream_options = None
    choices = 1
    deterministic = True  # an embedding is a function of its input
    output_limit = 0

    @property
    def stops(self) -> list[str]:
        return []

    def check(self) -> str | None:
        """What is wrong with `input`, or None."""
        if isinstance(self.input, str):
            return None
        kinds = {type(x) for x in self.input}
        if len(kinds) > 1:
            return "input mixes texts, token ids and token-id lists"
        if kinds != {int} and len(self.input) > MAX_EMBEDDING_INPUTS:
            return f"at most {MAX_EMBEDDING_INPUTS} inputs per request"
        return None

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """One entry per vector to return: texts, or token-id lists."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [cast(list[int], self.input)]
        return cast(list[str] | list[list[int]], self.input)  # validate() refused a mix

    def texts(self) -> list[str]:
        return [t for t in self.inputs if isinstance(t, str)]

    def token_count(self) -> int:
        """Tokens of the token-id inputs (text inputs are estimated from their length)."""
        return sum(len(t) for t in self.inputs if isinstance(t, list))


Body = ChatBody | CompletionBody | EmbeddingBody
KNOWN_CHAT_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(ChatBody))
KNOWN_COMPLETION_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(CompletionBody))
KNOWN_EMBEDDING_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(EmbeddingBody))
