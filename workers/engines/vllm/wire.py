"""Between Laneway's `EngineRequest` and vLLM's own OpenAI serving layer (vLLM 0.32).

Follows `vllm/entrypoints/openai/{chat_completion,completion}/protocol.py` (the pydantic
`ChatCompletionRequest` / `CompletionRequest` the HTTP server validates) and the SSE chunks their
`serving.py` stream generators write (`ChatCompletionStreamResponse` / `CompletionStreamResponse`,
and `{"error": ErrorInfo}` from `create_streaming_error_response`). Imports vllm lazily.

Embeddings follow `vllm/entrypoints/pooling/embed/{protocol,serving}.py`: the body validated as
`EmbeddingCompletionRequest`, answered by `ServingEmbedding` with an `EmbeddingResponse` whose
vectors we ask for as base64 of little-endian float32 (`embed_dtype`, `endianness`), so they
reach `EngineOutput.vectors` without a round trip through JSON floats.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from schemas.codec import LANEWAY_OWNED
from schemas.openai import ChatBody, EmbeddingBody
from schemas.openai_extra import VLLM_COMPLETION, VLLM_EMBEDDING, VLLM_SAMPLING, VLLM_TEMPLATE
from workers.engine import EngineOutput, EngineRequest, UnsupportedRequest
from workers.engines import openai_wire as wire
from workers.engines.vllm.media_urls import MediaFetchPolicy, first_refused_media_url

# Laneway owns these: set from the EngineRequest, never taken from the client.
_OWNED = LANEWAY_OWNED | {"stream", "stream_options", "model"}
# What a client may set beyond the typed body: an allow-list, so that a field vLLM learns in a
# later release reaches no tenant unread. Left out on purpose: a client's own `chat_template`
# (Jinja the engine would run) and `mm_processor_kwargs` / `media_io_kwargs` (how much media
# work one request makes); disaggregated-serving handles and `vllm_xargs`; beam search (its
# requests run under other ids, which abort and capacity() do not see); outputs the chunk reader
# does not carry back (prompt logprobs, token offsets, the rendered prompt); and, for
# embeddings, how vectors travel to us (`embed_dtype`, `endianness`: ours to choose; the
# client's `encoding_format` is honoured at the edge).
_CHAT = VLLM_SAMPLING | VLLM_TEMPLATE


def build_request(
    request: EngineRequest, served_name: str, media: MediaFetchPolicy = MediaFetchPolicy(), left: int | None = None
) -> Any:
    """vLLM's pydantic request for this body and its extra fields, streaming with usage, carrying
    Laneway's request id, priority and cache salt. Raises `UnsupportedRequest` naming the field,
    and for a media URL `media` does not let vLLM fetch (the default: any but a data: URL).
    A continuation's `left`: the output tokens its answer may still have."""
    chat = isinstance(request.body, ChatBody)
    cls = _request_class(chat)
    rid = request.request_id
    best_of = getattr(request.body, "best_of", None)
    if best_of is not None and best_of != request.body.choices:
        # vLLM 0.32's CompletionRequest has no best_of: it would be ignored.
        raise UnsupportedRequest(rid, "best_of", "best_of other than n is not supported by this engine")
    data = _merged(request, cls, _CHAT if chat else VLLM_COMPLETION)
    if request.continued is not None and left is not None:
        _count_from_the_start(data, chat, left, len(request.continued.token_ids))
    # Read in the very JSON vLLM validates next, before it can fetch anything.
    if chat and (url := first_refused_media_url(data["messages"], media)) is not None:
        raise UnsupportedRequest(rid, url.param, url.message)
    # Always streamed, usage on the last chunk (exact counts); token ids ride on each chunk
    # (and the prompt's once, on the first: how we learn its length for capacity()).
    # A LoRA adapter is served under its own name (vLLM's serving layer finds it by that name).
    model = request.body.model if request.adapter else served_name
    data.update(
        model=model,
        stream=True,
        stream_options={"include_usage": True},
        request_id=request.key.scoped(),
        priority=request.priority,
        return_token_ids=True,
    )
    if request.cache_salt:
        data["cache_salt"] = request.cache_salt
    if request.confidence:
        _ask_logprobs(data, chat)
    return validate(cls, data, rid)


def _count_from_the_start(data: dict[str, Any], chat: bool, left: int, replayed: int) -> None:
    """A continuation's limits on output count the answer's start, prefilled as prompt: it may
    generate `left` tokens more (vLLM's limit for the whole answer, less `replayed`)."""
    data.pop("max_tokens", None)
    data.pop("max_completion_tokens", None)
    data["max_completion_tokens" if chat else "max_tokens"] = left
    if data.get("min_tokens") is not None:
        data["min_tokens"] = max(0, data["min_tokens"] - replayed)


def _request_class(chat: bool) -> type:
    if chat:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return CompletionRequest


def build_embedding_request(request: EngineRequest, served_name: str) -> Any:
    """vLLM's pydantic `EmbeddingCompletionRequest` for an `EmbeddingBody` and its extra fields,
    asking for base64 float32 little-endian vectors. Raises `UnsupportedRequest` naming the field."""
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    assert isinstance(request.body, EmbeddingBody)
    cls, rid = EmbeddingCompletionRequest, request.request_id
    data = _merged(request, cls, VLLM_EMBEDDING)
    data.update(
        model=served_name,
        request_id=request.key.scoped(),
        priority=request.priority,
        encoding_format="base64",
        embed_dtype="float32",
        endianness="little",
    )
    if request.cache_salt:
        data["cache_salt"] = request.cache_salt
    return validate(cls, data, rid)


def _merged(request: EngineRequest, cls: type, allowed: frozenset[str]) -> dict[str, Any]:
    """The body's fields and the extra ones; an extra field outside `allowed`, or one this vLLM's
    request model does not know (it would ignore it silently), is refused by name."""
    rid = request.request_id
    data = msgspec.to_builtins(request.body)
    if not request.extra:
        return data
    try:
        extra = json.loads(request.extra)
    except ValueError as e:
        raise UnsupportedRequest(rid, "", f"extra fields are not a JSON object: {e}") from e
    if not isinstance(extra, dict):
        raise UnsupportedRequest(rid, "", "extra fields are not a JSON object")
    if (name := refused_extra(extra, allowed, _field_names(cls))) is not None:
        raise UnsupportedRequest(rid, name, f"unsupported parameter: {name!r}")
    data.update((k, v) for k, v in extra.items() if k not in _OWNED)
    return data


def refused_extra(extra: dict[str, Any], allowed: frozenset[str], known: set[str]) -> str | None:
    """The first extra field (by name) this engine does not take; Laneway's own are dropped."""
    return next(
        (name for name in sorted(extra) if name not in _OWNED and (name not in allowed or name not in known)), None
    )


def _field_names(cls: Any) -> set[str]:
    names = set(cls.model_fields)
    names.update(f.alias for f in cls.model_fields.values() if f.alias)
    return names


def _ask_logprobs(data: dict[str, Any], chat: bool) -> None:
    """The cascade needs each sampled token's logprob; ask for them when the client did not
    (the reader then keeps them out of `EngineOutput.logprobs`)."""
    if chat and not data.get("logprobs"):
        data["logprobs"], data["top_logprobs"] = True, 0
    elif not chat and data.get("logprobs") is None:
        data["logprobs"] = 0


def validate(cls: Any, data: dict[str, Any], rid: str) -> Any:
    import pydantic
    from vllm.exceptions import VLLMValidationError

    try:
        return cls.model_validate(data)
    except VLLMValidationError as e:
        raise UnsupportedRequest(rid, e.parameter or "", str(e)) from e
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        raise UnsupportedRequest(rid, param, f"{param}: {first.get('msg', e)}") from e


# -- reading the SSE chunks (the OpenAI chunk shapes: workers/engines/openai_wire.py) -------------------


class StreamError(Exception):
    """vLLM's serving layer answered with an error (before or during the stream)."""

    def __init__(self, info: wire.ErrorBody) -> None:
        super().__init__(info.message)
        self.info = info


class ChunkReader:
    """Turns one request's SSE strings into `EngineOutput`s, one per choice delta."""

    def __init__(self, request: EngineRequest) -> None:
        self.client_logprobs = wire.client_wants_logprobs(request.body)
        self.confidence = request.confidence
        self.finish: dict[int, str] = {}
        self.prompt_tokens: int | None = None
        self.usage: wire.Usage | None = None
        self.done = False

    def read(self, sse: str) -> list[EngineOutput]:
        """The outputs in one SSE event; raises `StreamError` for an error event."""
        payload = sse.removeprefix("data: ").rstrip()
        if payload == "[DONE]":
            self.done = True
            return []
        chunk = wire.decode_chunk(payload)
        if chunk.error is not None:
            raise StreamError(chunk.error)
        if chunk.prompt_token_ids is not None:
            self.prompt_tokens = len(chunk.prompt_token_ids)
        for choice in chunk.choices:  # completions: prompt ids on each choice's first chunk
            if choice.prompt_token_ids is not None:
                self.prompt_tokens = len(choice.prompt_token_ids)
        if chunk.usage is not None:
            self.usage = chunk.usage
        outs = []
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                self.finish[choice.index] = choice.finish_reason
            out = wire.choice_output(choice, logprobs=self.client_logprobs, confidence=self.confidence)
            if out is not None:
                outs.append(out)
        return outs

    def finished(self, n: int) -> bool:
        return len(self.finish) >= n

    def last(self, out: EngineOutput | None, n: int) -> EngineOutput:
        """The final output: `out` (the last delta, if any) with the finish and exact usage."""
        out = out or EngineOutput(text="")
        reasons = [self.finish.get(i, "abort") for i in range(n)]
        out.finish_reason, out.finish_reasons = reasons[0], reasons
        if self.usage is not None:
            out.prompt_tokens = self.usage.prompt_tokens
            out.completion_tokens = self.usage.completion_tokens
            out.cached_tokens = self.usage.cached_tokens
        return out


def read_embeddings(status: int, body: bytes, count: int) -> tuple[list[bytes], int]:
    """`ServingEmbedding`'s answer (status, JSON body) → one float32 LE vector per input, in input
    order, and the prompt tokens. Raises `StreamError` for an error answer, `ValueError` for an
    answer that is not what we asked for."""
    if status != 200:
        try:
            info = wire.decode_error(body).error
        except msgspec.DecodeError:
            info = None
        raise StreamError(info or wire.ErrorBody(message=f"vLLM answered HTTP {status}", code=status))
    answer = wire.decode_embeddings(body)
    vectors = wire.embedding_vectors(answer, count)
    return vectors, answer.usage.prompt_tokens if answer.usage is not None else 0
