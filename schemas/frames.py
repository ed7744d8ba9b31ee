"""Token frames: ONE message per engine step per reply inbox, carrying entries for many streams.

Every entry names its request, the JetStream delivery attempt that produced it (the edge drops
entries from stale attempts) and a per-attempt sequence number (the edge detects gaps).
Process-boundary structs are array_like with integer tags, as in vLLM's engine core messages:
compact on the wire and cheap to decode. New fields go at the end, with defaults.
"""

from __future__ import annotations

import msgspec


class TokenUsage(msgspec.Struct, array_like=True, gc=False):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, read from the engine's prefix cache (as OpenAI counts)


class TopLogprob(msgspec.Struct, array_like=True, gc=False):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct, array_like=True, gc=False):
    """One generated token's log-probability and its most likely alternatives (OpenAI's
    `ChatCompletionTokenLogprob`)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top: list[TopLogprob] = []


class ToolCallDelta(msgspec.Struct, array_like=True, gc=False):
    """A piece of a tool call, as OpenAI streams it: the first piece of call `index` carries its
    id and function name, later ones more of the arguments' JSON text."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class Delta(msgspec.Struct, tag=0, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    text: str
    token_ids: list[int] = []
    choice: int = 0  # which of the request's `n` choices
    tool_calls: list[ToolCallDelta] = []
    logprobs: list[TokenLogprob] = []  # only when the client asked for them
    refusal: str = ""
    reasoning: str = ""  # a reasoning model's thinking (vLLM's reasoning parsers)
    headers: dict[str, str] = {}  # on a stream's first delta: for the edge's answer (x-ratelimit-*)

    @property
    def plain(self) -> bool:
        """Text of choice 0 and nothing else: may merge with the next plain delta."""
        return not (self.choice or self.tool_calls or self.logprobs or self.refusal or self.reasoning)


class Finished(msgspec.Struct, tag=1, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    finish_reason: str  # "stop" | "length" | "tool_calls" | "cancelled"
    usage: TokenUsage
    model: str = ""  # the real model that served it
    finish_reasons: list[str] = []  # per choice, when the request asked for n > 1
    vectors: list[bytes] = []  # an embedding request's answer: float32 little-endian, per input
    headers: dict[str, str] = {}  # for the edge's answer when no Delta came first (embeddings)
    messages: bytes = b""  # the chat messages the engine got (JSON), when the request asked (echo_input)
    fields: bytes = b""  # the chat's other texts and `kept`, so (`GenerateRequest.echoed_fields`)


class StreamError(msgspec.Struct, tag=2, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    code: str  # an `ErrorCode` value
    message: str
    param: str | None = None  # the request field at fault, when there is one
    headers: dict[str, str] = {}  # for the edge's answer, e.g. Retry-After, x-ratelimit-*


Entry = Delta | Finished | StreamError
Terminal = (Finished, StreamError)


class TokenFrame(msgspec.Struct, array_like=True, gc=False):
    source: str  # worker id, or "broker" for refusals
    entries: list[Entry]
    sent_at: float = 0.0  # unix time at publish: the edge measures delivery lag
