"""A request running on a worker, as `Serving` keeps it (the orphan sweep and the runner read
it too), and the acks it ends with."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from schemas.frames import Delta
from schemas.work import Dispatch
from workers.engine import Continued, EngineOutput
from workers.pii import OutputRedaction


def nak_with_delay(delay_s: float) -> bytes:
    return b'-NAK {"delay": %d}' % int(delay_s * 1e9)


@dataclass(slots=True, eq=False)
class Active:
    """A request running on this worker."""

    dispatch: Dispatch
    started: float
    seq: int = 0
    streamed: bool = False
    cancelled: bool = False
    first_token_at: float | None = None
    task: asyncio.Task[None] | None = None
    tokens: int = 0
    parts: list[Delta] | None = None  # the answer's deltas, kept only when it will be cached
    redaction: OutputRedaction | None = None  # the tenant's PII policy on the answer
    cached_tokens: int = 0  # the engine's prefix-cache hits (metered)
    continued: Continued | None = None  # a continuation: the answer's start, streamed by a lost worker
    delivered_before: int = 0  # tokens the client got from lost workers (none of them metered it)

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq


def carries(out: EngineOutput) -> bool:
    return bool(out.text or out.token_ids or out.tool_calls or out.refusal or out.reasoning or out.logprobs)


def is_plain(out: EngineOutput) -> bool:
    """Text of choice 0 only: merges into the stream's open delta (one SSE chunk at the edge)."""
    return not (out.index or out.tool_calls or out.logprobs or out.refusal or out.reasoning)
