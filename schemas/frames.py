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


class Delta(msgspec.Struct, tag=0, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    text: str
    token_ids: list[int] = []


class Finished(msgspec.Struct, tag=1, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    finish_reason: str              # "stop" | "length" | "cancelled"
    usage: TokenUsage
    model: str = ""                 # the real model that served it


class StreamError(msgspec.Struct, tag=2, array_like=True, gc=False):
    request_id: str
    attempt: int
    seq: int
    code: str                       # an `ErrorCode` value
    message: str
    param: str | None = None        # the request field at fault, when there is one
    headers: dict[str, str] = {}    # for the edge's answer, e.g. Retry-After, x-ratelimit-*


Entry = Delta | Finished | StreamError
Terminal = (Finished, StreamError)


class TokenFrame(msgspec.Struct, array_like=True, gc=False):
    source: str                     # worker id, or "broker" for refusals
    entries: list[Entry]
    sent_at: float = 0.0            # unix time at publish: the edge measures delivery lag
