"""Entries → OpenAI bytes: SSE chunks for streams, one JSON object otherwise, for chat
completions and text completions.

The hot path at thousands of open streams is a plain text delta: its chunk is a byte template
built once per response plus one `orjson.dumps` of the text. Tool-call, logprob, refusal and
multi-choice deltas take the general path (a dict per chunk).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import orjson

from bridge.render.embeddings import EmbeddingRenderer
from schemas.codec import encode_json
from schemas.frames import Delta, Finished, TokenLogprob
from schemas.openai import FunctionCall, ToolCall
from schemas.openai_out import (
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    ChoiceMessage,
    CompletionUsage,
    PromptTokensDetails,
    TextChoice,
    TextCompletion,
    TextLogprobs,
)
from schemas.requests import GenerateRequest

# Laneway's finish reasons → OpenAI's ("cancelled" never reaches a client that is still there).
FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "abort": "stop",
    "cancelled": "stop",
}


def finish_reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, "stop")


def fingerprint(model: str) -> str | None:
    """`system_fingerprint`: changes when the model behind the answer changes."""
    return "fp_" + hashlib.sha256(model.encode()).hexdigest()[:10] if model else None


def _token_logprob(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in lp.top],
    }


class _Choice:
    """One choice's answer, accumulated for a non-streamed response."""

    __slots__ = ("parts", "refusal", "reasoning", "calls", "logprobs", "finish")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index → [id, name, arguments...]
        self.logprobs: list[TokenLogprob] = []
        self.finish = "stop"

    def add(self, delta: Delta) -> None:
        if delta.text:
            self.parts.append(delta.text)
        if delta.refusal:
            self.refusal.append(delta.refusal)
        if delta.reasoning:
            self.reasoning.append(delta.reasoning)
        for call in delta.tool_calls:
            pieces = self.calls.setdefault(call.index, ["", ""])
            pieces[0] = pieces[0] or call.id
            pieces[1] = pieces[1] or call.name
            pieces.append(call.arguments)
        self.logprobs.extend(delta.logprobs)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(id=p[0], function=FunctionCall(name=p[1], arguments="".join(p[2:])))
            for _, p in sorted(self.calls.items())
        ]


class Renderer:
    """Shared by both endpoints: ids, the choices being accumulated, usage."""

    chunk_object = b""
    id_prefix = ""

    def __init__(self, generate: GenerateRequest) -> None:
        self.generate = generate
        self.id = f"{self.id_prefix}-{generate.request_id}"
        self.created = int(generate.created_at)
        self.model = generate.model
        self.n = generate.choices
        self.logprobs = False
        self._choices = [_Choice() for _ in range(self.n)]
        self._head = (
            b'data: {"id":'
            + orjson.dumps(self.id)
            + b',"object":"'
            + self.chunk_object
            + b'","created":'
            + str(self.created).encode()
            + b',"model":'
            + orjson.dumps(self.model)
        )

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> bytes:
        return (
            self._head
            + b',"choices":'
            + orjson.dumps(choices)
            + (b"," + orjson.dumps(more)[1:-1] if more else b"")
            + b"}\n\n"
        )

    def add(self, delta: Delta) -> None:
        if delta.choice < self.n:
            self._choices[delta.choice].add(delta)

    def usage_chunk(self, finished: Finished) -> bytes:
        return self._chunk([], usage=msgspec.to_builtins(usage_of(finished)))

    def _finishes(self, finished: Finished) -> list[str]:
        reasons = finished.finish_reasons or [finished.finish_reason]
        return [finish_reason(reasons[i] if i < len(reasons) else reasons[-1]) for i in range(self.n)]


def usage_of(finished: Finished) -> CompletionUsage:
    u = finished.usage
    return CompletionUsage(
        u.prompt_tokens,
        u.completion_tokens,
        u.prompt_tokens + u.completion_tokens,
        PromptTokensDetails(u.cached_tokens),
    )


class ChatRenderer(Renderer):
    chunk_object = b"chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, generate: GenerateRequest) -> None:
        super().__init__(generate)
        body = generate.chat
        self.logprobs = bool(body and body.logprobs)
        self._open = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._text = self._head + b',"choices":[{"index":0,"delta":{"content":'

    def start(self) -> bytes:
        return b"".join(
            self._chunk(
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
            )
            for i in range(self.n)
        )

    def delta(self, delta: Delta) -> bytes:
        if delta.plain:
            return self._text + orjson.dumps(delta.text) + b"}" + self._open
        out: dict[str, Any] = {}
        if delta.text:
            out["content"] = delta.text
        if delta.reasoning:
            out["reasoning_content"] = delta.reasoning
        if delta.refusal:
            out["refusal"] = delta.refusal
        if delta.tool_calls:
            out["tool_calls"] = [_call_delta(c) for c in delta.tool_calls]
        logprobs = (
            {"content": [_token_logprob(lp) for lp in delta.logprobs], "refusal": None}
            if self.logprobs and delta.logprobs
            else None
        )
        return self._chunk([{"index": delta.choice, "delta": out, "logprobs": logprobs, "finish_reason": None}])

    def finish(self, finished: Finished) -> bytes:
        return b"".join(
            self._chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
            for i, reason in enumerate(self._finishes(finished))
        )

    def body(self, finished: Finished) -> bytes:
        choices = []
        for i, (choice, reason) in enumerate(zip(self._choices, self._finishes(finished), strict=True)):
            content = "".join(choice.parts)
            message = ChoiceMessage(
                # With tool calls and no text, content is null (OpenAI's shape); else a string.
                content=None if choice.calls and not content else content,
                refusal="".join(choice.refusal) or None,
                tool_calls=choice.tool_calls() if choice.calls else msgspec.UNSET,
                reasoning_content="".join(choice.reasoning) if choice.reasoning else msgspec.UNSET,
            )
            logprobs = ChoiceLogprobs([_token_logprob(lp) for lp in choice.logprobs]) if self.logprobs else None
            choices.append(Choice(i, message, reason, logprobs))
        return encode_json(
            ChatCompletion(self.id, self.created, self.model, choices, usage_of(finished), fingerprint(finished.model))
        )


def _call_delta(call: Any) -> dict[str, Any]:
    if call.id or call.name:
        return {
            "index": call.index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    return {"index": call.index, "function": {"arguments": call.arguments}}


class TextRenderer(Renderer):
    """`text_completion` objects; logprobs in the legacy shape (tokens, token_logprobs, ...)."""

    chunk_object = b"text_completion"
    id_prefix = "cmpl"

    def __init__(self, generate: GenerateRequest) -> None:
        super().__init__(generate)
        body = generate.completion
        self.logprobs = bool(body is not None and body.logprobs is not None)

    def start(self) -> bytes:
        return b""

    def delta(self, delta: Delta) -> bytes:
        legacy = msgspec.to_builtins(self._legacy(delta.logprobs)) if self.logprobs else None
        return self._chunk([{"index": delta.choice, "text": delta.text, "logprobs": legacy, "finish_reason": None}])

    def finish(self, finished: Finished) -> bytes:
        return b"".join(
            self._chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": reason}])
            for i, reason in enumerate(self._finishes(finished))
        )

    def body(self, finished: Finished) -> bytes:
        choices = [
            TextChoice(i, "".join(c.parts), reason, self._legacy(c.logprobs) if self.logprobs else None)
            for i, (c, reason) in enumerate(zip(self._choices, self._finishes(finished), strict=True))
        ]
        return encode_json(
            TextCompletion(self.id, self.created, self.model, choices, usage_of(finished), fingerprint(finished.model))
        )

    @staticmethod
    def _legacy(logprobs: list[TokenLogprob]) -> TextLogprobs:
        offsets, at = [], 0
        for lp in logprobs:
            offsets.append(at)
            at += len(lp.token)
        return TextLogprobs(
            [lp.token for lp in logprobs],
            [lp.logprob for lp in logprobs],
            [{t.token: t.logprob for t in lp.top} for lp in logprobs],
            offsets,
        )


def renderer_for(generate: GenerateRequest) -> ChatRenderer | TextRenderer | EmbeddingRenderer:
    if generate.chat is not None:
        return ChatRenderer(generate)
    if generate.embedding is not None:
        return EmbeddingRenderer(generate)
    return TextRenderer(generate)
