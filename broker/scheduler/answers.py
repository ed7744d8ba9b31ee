"""Answers for a request that will not run on a worker (refused, or a cache hit), and acks for a
message the scheduler holds only by its ack subject (another broker consumed it)."""

from __future__ import annotations

import time

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.metrics import BrokerMetrics
from broker.pools import Acks
from broker.waiting import Admit
from core.cache import CachedResponse, replay_entries, replay_usage
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Finished, StreamError, TokenFrame
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects

ADMIT_ERRORS = {
    Admit.QUEUE_FULL: (ErrorCode.queue_full, "this tenant's queue for the class is full"),
    Admit.UNKNOWN_CLASS: (ErrorCode.unknown_class, "unknown priority class"),
    Admit.EXPIRED: (ErrorCode.deadline_exceeded, "the request's deadline passed before it could start"),
}


class AckHandle:
    """What nats-py's `Msg.in_progress` / `term` / `nak` publish, by the ack subject alone."""

    __slots__ = ("_nc", "reply")

    def __init__(self, nc: Client, reply: str) -> None:
        self._nc = nc
        self.reply = reply

    async def in_progress(self) -> None:
        await self._nc.publish(self.reply, Msg.Ack.Progress)

    async def term(self) -> None:
        await self._nc.publish(self.reply, Msg.Ack.Term)

    async def nak(self) -> None:
        await self._nc.publish(self.reply, Msg.Ack.Nak)


async def refuse(
    nc: Client,
    metrics: BrokerMetrics,
    ack: Acks,
    request: GenerateRequest,
    attempt: int,
    code: ErrorCode,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Remove the message, then tell the client. Its quota grant is the caller's to give back."""
    metrics.rejected.labels(code.value).inc()
    await ack.term()
    error = StreamError(request.request_id, attempt, 0, code.value, message, param, headers or {})
    await nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))


async def replay(
    nc: Client,
    s: Subjects,
    msg: Msg,
    request: GenerateRequest,
    hit: CachedResponse,
    attempt: int,
    headers: dict[str, str],
    pool: str,
) -> None:
    """A cache hit streams back as a normal stream, and is metered as cached."""
    entries = replay_entries(hit, request.request_id, attempt, headers)
    finished = entries[-1]
    assert isinstance(finished, Finished)  # replay_entries ends with it
    finished.messages, finished.fields = request.echoed()  # the input as redacted
    await nc.publish(request.reply_to, codec.encode(TokenFrame("cache", entries, time.time())))
    await nc.publish(s.usage(request.tenant), codec.encode(replay_usage(hit, request, pool)))
    await msg.ack()
