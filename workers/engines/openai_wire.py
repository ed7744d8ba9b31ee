"""Wire shapes of the OpenAI-compatible API, as the `openai` engine writes them and as both the
`openai` and the `vllm` engine read them (vLLM's serving layer writes the same chunks).

Requests: the client's typed body, re-encoded, with those of its other top-level fields (`extra`)
that the engine forwards (an allow-list, `forwarded_extra`: what reaches a hosted upstream acts
on the operator's account) spliced in verbatim. Responses: chunks decoded leniently (upstreams
differ in what they add or omit) and mapped onto Laneway's own delta shapes.

Embeddings are not streamed: the body goes to `/embeddings` with `model` replaced and
`encoding_format: "base64"` asked for, and the answer's vectors are decoded straight to float32
little-endian bytes (an upstream that answers with float lists anyway is converted).
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array

import msgspec

from schemas.codec import LANEWAY_OWNED
from schemas.frames import TokenLogprob, ToolCallDelta, TopLogprob
from schemas.openai import Body, ChatBody, CompletionBody, EmbeddingBody, StreamOptions
from schemas.openai_extra import (
    ACCOUNT_DEFAULTS,
    ACCOUNT_FIELDS,
    EMBEDDING_INPUT_TYPE,
    OPENAI_TENANT,
    VLLM_COMPLETION,
    VLLM_EMBEDDING,
    VLLM_GUIDED,
    VLLM_SAMPLING,
    VLLM_TEMPLATE,
)
from workers.engine import EngineOutput, EngineRequest, UnsupportedRequest

# -- the request ---------------------------------------------------------------------------------

# Never forwarded from a client's extra fields: what the engine sets (model, streaming), what
# Laneway owns (the upstream's prefix-cache salt, priority, ids), and a vLLM upstream's
# disaggregated-serving handles.
DROPPED_EXTRA = LANEWAY_OWNED | {
    "model",
    "stream",
    "stream_options",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
}
# What a tenant may send an OpenAI-compatible upstream (OpenAI's own, or a vLLM server): OpenAI's
# fields that shape the answer, vLLM's sampling and template fields. The account's fields, and
# anything else, only where the operator allows them (`OpenAIUpstreamConfig.allow_fields`).
FORWARDED = OPENAI_TENANT | VLLM_SAMPLING | VLLM_TEMPLATE | VLLM_GUIDED | VLLM_COMPLETION
FORWARDED_EMBEDDING = VLLM_EMBEDDING | EMBEDDING_INPUT_TYPE
_STREAM_OPTIONS = StreamOptions(include_usage=True)
_VERY_UNLIKELY = -9999.0  # OpenAI's (and vLLM's) logprob for "practically impossible"

_encode = msgspec.json.Encoder().encode
_decode_members = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_value = msgspec.json.Decoder().decode


def path_of(body: Body) -> str:
    if isinstance(body, EmbeddingBody):
        return "/embeddings"
    return "/chat/completions" if isinstance(body, ChatBody) else "/completions"


def client_wants_logprobs(body: Body) -> bool:
    return not isinstance(body, EmbeddingBody) and body.wants_logprobs


def encode_embedding_body(body: EmbeddingBody, model: str, extra: bytes = b"") -> bytes:
    """The upstream's `/embeddings` body: `body` with `model` replaced and base64 vectors asked
    for (the client's own `encoding_format` is honoured at the edge), then `extra`'s members."""
    typed = _encode(msgspec.structs.replace(body, model=model, encoding_format="base64"))
    members = _extra_members(extra)
    return typed[:-1] + b"," + members + b"}" if members else typed


def encode_body(body: Body, model: str, extra: bytes = b"", *, sampled_logprobs: bool = False) -> bytes:
    """The upstream's request body: `body` with `model` replaced and streaming with usage forced,
    then `extra`'s members spliced in as they are. `sampled_logprobs` asks for each sampled
    token's logprob (no alternatives) when the client did not ask for logprobs itself."""
    changes: dict[str, object] = {"model": model, "stream": True, "stream_options": _STREAM_OPTIONS}
    if sampled_logprobs and not client_wants_logprobs(body):
        changes["logprobs"] = True if isinstance(body, ChatBody) else 0
    typed = _encode(msgspec.structs.replace(body, **changes))
    members = _extra_members(extra)
    if isinstance(body, CompletionBody) and body.max_tokens == 16:
        # omit_defaults leaves out the OpenAI default; an upstream with another default must not guess.
        members = b'"max_tokens":16' + (b"," + members if members else b"")
    return typed[:-1] + b"," + members + b"}" if members else typed


def forwarded_extra(request: EngineRequest, allowed: frozenset[str] = frozenset()) -> bytes:
    """`request.extra` as the upstream may receive it: the built-in list and `allowed` (the
    operator's). A field outside them is refused by name, as OpenAI refuses an argument it does
    not know; an account field the operator does not allow is left out when it says what the
    upstream does anyway (`store: false`), refused otherwise. Raises ValueError when `extra` is
    not a JSON object."""
    if not request.extra.strip():
        return request.extra
    try:
        members = _decode_members(request.extra)
    except msgspec.DecodeError:
        raise ValueError("extra must be a JSON object") from None
    forwarded = (FORWARDED_EMBEDDING if isinstance(request.body, EmbeddingBody) else FORWARDED) | allowed
    kept = {}
    for name, value in members.items():
        if name in forwarded or name in LANEWAY_OWNED:  # Laneway's own: `encode_body` drops them
            kept[name] = value
        elif name in ACCOUNT_FIELDS:
            default = ACCOUNT_DEFAULTS.get(name)
            if default is not None and _is(_decode_value(value), default):
                continue
            raise UnsupportedRequest(
                request.request_id,
                name,
                f"{name!r} acts on the operator's account with "
                "the upstream, and this pool's operator does not allow it",
            )
        else:
            raise UnsupportedRequest(request.request_id, name, f"unsupported parameter: {name!r}")
    return _encode(kept) if len(kept) < len(members) else request.extra


def _is(value: object, default: object) -> bool:
    return type(value) is type(default) and value == default  # 0 is not false here


def _extra_members(extra: bytes) -> bytes:
    """The members of the JSON object `extra`, without its braces: b"" when there are none.
    Parsed at the top level only (values stay their raw bytes) and re-joined, so nothing but
    whole members can be spliced after the typed fields; dropped fields are left out."""
    if not extra.strip():
        return b""
    try:
        members = _decode_members(extra)
    except msgspec.DecodeError:
        raise ValueError("extra must be a JSON object") from None
    kept = {k: v for k, v in members.items() if k not in DROPPED_EXTRA}
    return _encode(kept)[1:-1] if kept else b""


# -- the stream ----------------------------------------------------------------------------------


class FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCallChunk(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # vLLM, DeepSeek
    reasoning: str | None = None  # newer vLLM, OpenRouter
    tool_calls: list[ToolCallChunk] | None = None
    function_call: FunctionDelta | None = None  # the legacy single-function shape


class TopLogprobChunk(msgspec.Struct):
    token: str
    logprob: float | None = None
    bytes: list[int] | None = None


class TokenLogprobChunk(msgspec.Struct):
    token: str
    logprob: float | None = None
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprobChunk] | None = None


class Logprobs(msgspec.Struct):
    content: list[TokenLogprobChunk] | None = None  # chat
    tokens: list[str] | None = None  # completions, column-wise
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class Choice(msgspec.Struct):
    index: int = 0
    delta: Delta | None = None  # chat/completions
    text: str | None = None  # completions
    finish_reason: str | None = None
    logprobs: Logprobs | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids
    prompt_token_ids: list[int] | None = None  # ... completions: on a choice's first chunk


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None  # vLLM may send null


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # vLLM: with enable_prompt_tokens_details

    @property
    def cached_tokens(self) -> int:
        """Prefix-cache hits within the prompt tokens; 0 when the upstream does not say."""
        details = self.prompt_tokens_details
        hits = details.cached_tokens if details is not None else None
        return min(max(hits or 0, 0), self.prompt_tokens)


class ErrorBody(msgspec.Struct):
    message: str = ""
    param: str | None = None
    type: str = ""
    code: int | str | None = None  # vLLM: the HTTP status it would answer with


class Chunk(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: ErrorBody | None = None  # in-band error after the stream started (vLLM)
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids, chat: on the first chunk


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody | None = None
    message: str | None = None  # older vLLM puts the error at the top level
    param: str | None = None


class EmbeddingData(msgspec.Struct):
    index: int = 0
    embedding: str | list[float] = ""  # base64 as asked; some upstreams send floats anyway


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int = 0


class EmbeddingResponse(msgspec.Struct):
    data: list[EmbeddingData] = []
    usage: EmbeddingUsage | None = None


class BadEmbeddings(ValueError):
    """The upstream's embedding answer is not one float32 vector per input."""


def embedding_vectors(answer: EmbeddingResponse, count: int) -> list[bytes]:
    """One float32 little-endian vector per input, in input order (by `index`)."""
    if sorted(d.index for d in answer.data) != list(range(count)):
        raise BadEmbeddings(f"{len(answer.data)} embeddings for {count} inputs")
    vectors: list[bytes] = [b""] * count
    for d in answer.data:
        if isinstance(d.embedding, str):
            try:
                raw = base64.b64decode(d.embedding, validate=True)
            except binascii.Error:
                raise BadEmbeddings(f"embedding {d.index} is not base64") from None
        else:
            values = array("f", d.embedding)
            if sys.byteorder != "little":  # pragma: no cover - the wire is little-endian
                values.byteswap()
            raw = values.tobytes()
        if not raw or len(raw) % 4:
            raise BadEmbeddings(f"embedding {d.index} is {len(raw)} bytes: not float32 values")
        vectors[d.index] = raw
    if len({len(v) for v in vectors}) > 1:
        raise BadEmbeddings("embeddings of different sizes")
    return vectors


def choice_output(choice: Choice, *, logprobs: bool, confidence: bool) -> EngineOutput | None:
    """One choice's piece of a chunk as an `EngineOutput`; None when it carries nothing (the
    role-only first chunk, a bare finish). Logprobs go to the client only when it asked for
    them (`logprobs`), sampled values to the cascade when it did (`confidence`)."""
    delta = choice.delta
    if (
        delta is not None
        and choice.logprobs is None
        and choice.token_ids is None
        and delta.refusal is None
        and delta.tool_calls is None
        and delta.function_call is None
        and delta.reasoning_content is None
        and delta.reasoning is None
    ):
        # Nearly every chunk: text only.
        return EngineOutput(delta.content, index=choice.index) if delta.content else None
    output = EngineOutput(text="", token_ids=choice.token_ids or [], index=choice.index)
    if delta is not None:
        output.text = delta.content or ""
        output.refusal = delta.refusal or ""
        output.reasoning = delta.reasoning_content or delta.reasoning or ""
        if delta.tool_calls or delta.function_call:
            output.tool_calls = tool_call_deltas(delta)
    else:
        output.text = choice.text or ""
    if choice.logprobs is not None:
        if logprobs:
            output.logprobs = token_logprobs(choice.logprobs)
        if confidence:
            output.confidence = sampled_logprobs(choice.logprobs)
    if (
        output.text
        or output.token_ids
        or output.tool_calls
        or output.logprobs
        or output.confidence
        or output.refusal
        or output.reasoning
    ):
        return output
    return None


def tool_call_deltas(delta: Delta) -> list[ToolCallDelta]:
    """The call pieces exactly as received: ids, names and argument fragments are not joined."""
    out = [
        ToolCallDelta(
            c.index,
            c.id or "",
            (c.function.name or "") if c.function else "",
            (c.function.arguments or "") if c.function else "",
        )
        for c in delta.tool_calls or ()
    ]
    if delta.function_call is not None:  # legacy: one call, always index 0
        out.append(ToolCallDelta(0, "", delta.function_call.name or "", delta.function_call.arguments or ""))
    return out


def token_logprobs(lp: Logprobs) -> list[TokenLogprob]:
    if lp.content is not None:
        return [
            TokenLogprob(
                t.token,
                _lp(t.logprob),
                t.bytes,
                [TopLogprob(a.token, _lp(a.logprob), a.bytes) for a in t.top_logprobs or ()],
            )
            for t in lp.content
        ]
    tokens, values, tops = lp.tokens or [], lp.token_logprobs or [], lp.top_logprobs or []
    return [
        TokenLogprob(
            token,
            _lp(values[i] if i < len(values) else None),
            None,
            [TopLogprob(k, v) for k, v in (tops[i] or {}).items()] if i < len(tops) else [],
        )
        for i, token in enumerate(tokens)
    ]


def sampled_logprobs(lp: Logprobs) -> list[float]:
    """Each sampled token's logprob (the cascade's confidence), skipping unknown ones (an echoed
    prompt's first token)."""
    if lp.content is not None:
        return [t.logprob for t in lp.content if t.logprob is not None]
    return [v for v in lp.token_logprobs or () if v is not None]


def _lp(value: float | None) -> float:
    return _VERY_UNLIKELY if value is None else value


def finish_reason(reason: str | None) -> str:
    """The upstream's finish reason in Laneway's vocabulary; unknown ones read as "stop"."""
    if reason == "function_call":
        return "tool_calls"
    return reason if reason in ("stop", "length", "tool_calls", "content_filter", "abort") else "stop"


decode_chunk = msgspec.json.Decoder(Chunk).decode
decode_error = msgspec.json.Decoder(ErrorEnvelope).decode
decode_embeddings = msgspec.json.Decoder(EmbeddingResponse).decode
