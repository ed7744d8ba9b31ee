"""Server-sent events in the OpenAI chat.completion.chunk format, rendered from byte templates.

This is the hot path at thousands of open streams: the constant part of every chunk is built
once per response, and each token costs one `orjson.dumps` of its text.
"""

from __future__ import annotations

import orjson

from schemas.codec import encode_json
from schemas.openai import CompletionUsage

DONE = b"data: [DONE]\n\n"

# Laneway's finish reasons → OpenAI's ("cancelled" never reaches a client that is still there).
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop", "cancelled": "stop"}


class ChunkRenderer:
    def __init__(self, completion_id: str, created: int, model: str) -> None:
        head = (b'data: {"id":' + orjson.dumps(completion_id)
                + b',"object":"chat.completion.chunk","created":' + str(created).encode()
                + b',"model":' + orjson.dumps(model))
        self._choice = head + b',"choices":[{"index":0,"delta":'
        self._usage_head = head + b',"choices":[],"usage":'
        self._open = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self) -> bytes:
        return self._choice + b'{"role":"assistant","content":""}' + self._open

    def content(self, text: str) -> bytes:
        return self._choice + b'{"content":' + orjson.dumps(text) + b"}" + self._open

    def finish(self, reason: str) -> bytes:
        return (self._choice + b'{},"logprobs":null,"finish_reason":'
                + orjson.dumps(FINISH_REASONS.get(reason, "stop")) + b"}]}\n\n")

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = CompletionUsage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        return self._usage_head + encode_json(usage) + b"}\n\n"


def error_event(error_body: bytes) -> bytes:
    """After the stream has started, errors go in-band, then [DONE] (as vLLM's server does)."""
    return b"data: " + error_body + b"\n\n"
