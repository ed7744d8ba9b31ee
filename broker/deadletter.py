"""Dead letters: requests that cannot be served go to `LW_DLQ` with their reason, once.

Two ways in: a message the broker cannot even read (malformed, or a subject/payload mismatch),
and JetStream's MAX_DELIVERIES advisory for a request whose every delivery died without an
answer (workers crashing on it). Records carry headers naming the reason; the client, where it
can be told safely, gets an `engine_error`.

What the broker cannot read costs its sender, not the other tenants: the intake counts it,
terminates it at once (it stops counting against the sender's backlog) and queues its record;
`run`, a task of its own, redacts and writes the records. The queue is bounded: in a flood the
records that do not fit are dropped and counted (`laneway_dead_letters_dropped_total{reason}`),
and the warning is sampled (core/logsample.py), so a sender decides neither how long the intake
waits nor how much the disk takes (LW_DLQ's own caps: core/topology.py). A record is written
after its message is gone, so a broker that dies in between loses it: a junk message's record is
a diagnosis, never the only copy of accepted work.

A record outlives the request (LW_DLQ keeps it for days), so with the PII stage on it never holds
the raw text: it holds the request as the gate lets it on, redacted under the tenant's policy
(the worker's own dead letters carry the admitted request, already redacted). A body that cannot
be decoded or analysed is withheld: the record keeps its size (`Laneway-Body: withheld`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.gate.pipeline import Gate
from broker.gate.validate import validate
from broker.metrics import BrokerMetrics
from core.logsample import SampledLog
from core.policy.refusal import Refusal
from core.policy.tenants import TenantDirectory
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import StreamError, TokenFrame
from schemas.requests import GenerateRequest
from schemas.subjects import BadToken, Subjects

log = logging.getLogger("laneway.dlq")

QUEUE_SIZE = 1024  # records waiting for `run`; one more is dropped (counted)
STOP_DRAIN_S = 2.0  # at stop, what is still queued gets this long to be written
LOG_EVERY_S = 10.0  # a warning per reason at most this often, with a count of the rest


@dataclass(frozen=True, slots=True)
class Letter:
    """What a record keeps of a message that is terminated before the record is written."""

    subject: str
    data: bytes
    reason: str
    detail: str
    attempt: int


class DeadLetters:
    def __init__(
        self,
        nc: Client,
        s: Subjects,
        metrics: BrokerMetrics,
        max_deliver: int,
        on_removed: Callable[[str, str], Awaitable[None]],
        gate: Gate,
        tenants: TenantDirectory,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._nc = nc
        self.s = s
        self._metrics = metrics
        self._max_deliver = max_deliver
        self._on_removed = on_removed  # (tenant, request_id): give back what it held
        self._gate = gate  # its PII stage redacts what a record keeps
        self._tenants = tenants
        self._queue: asyncio.Queue[Letter] = asyncio.Queue(queue_size)
        self._warn = SampledLog(log, LOG_EVERY_S)

    @property
    def advisory_subject(self) -> str:
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.s.req_stream}.*"  # every class's

    def _origin(self, subject: str) -> tuple[str, str]:
        try:
            klass, tenant, _ = self.s.parse_req(subject)
            return klass, tenant
        except BadToken:
            return "unknown", "unknown"

    @staticmethod
    def _decode(data: bytes) -> GenerateRequest | None:
        try:
            return codec.decode_request(data)
        except codec.DecodeError:
            return None

    def _entitled(self, request: GenerateRequest, klass: str, tenant: str) -> bool:
        try:
            validate(request, klass, tenant, self.s)
        except Refusal:
            return False
        return True

    async def _record(
        self, data: bytes, request: GenerateRequest | None, tenant: str, headers: dict[str, str]
    ) -> bytes:
        """The body a record keeps of `data` (`request` is its decoding, None if it has none):
        the bytes as they came with PII off, the redacted request with it on, nothing (and a
        header saying so) when that cannot be had (nor when the PII stage could not start)."""
        if not self._gate.pii_wanted:
            return data
        if request is not None and self._gate.pii is not None:
            redacted = await self._gate.redacted(request, tenant, self._tenants.get(tenant))
            if redacted is not None:
                return codec.encode(redacted)
        headers.update({"Laneway-Body": "withheld", "Laneway-Body-Bytes": str(len(data))})
        return b""

    async def unreadable(self, msg: Msg, reason: str, detail: str) -> None:
        """Count a message the broker cannot serve, queue its record and terminate it. Never
        waits on the DLQ: `run` writes the record; a full queue drops it (counted)."""
        self._metrics.dead_lettered.labels(reason).inc()
        self._warn.warning(reason, "dead-lettered a request on %s: %s", msg.subject, reason)
        try:
            self._queue.put_nowait(Letter(msg.subject, msg.data, reason, detail[:512], msg.metadata.num_delivered))
        except asyncio.QueueFull:
            self._metrics.dead_letters_dropped.labels(reason).inc()
        await msg.term()

    async def run(self) -> None:
        """Write the queued records, one at a time, until cancelled (the broker stopping); then
        write the one it was writing (again: a record twice, rather than none) and what is still
        queued, for at most STOP_DRAIN_S, count the rest dropped, and stop."""
        letter: Letter | None = None
        try:
            while True:
                letter = None
                letter = await self._queue.get()
                await self._write(letter)
        except asyncio.CancelledError:
            await self._drain(letter)
            raise

    async def _drain(self, writing: Letter | None) -> None:
        try:
            async with asyncio.timeout(STOP_DRAIN_S):
                if writing is not None:
                    await self._write(writing)
                while not self._queue.empty():
                    await self._write(self._queue.get_nowait())
        except TimeoutError:
            pass
        left = self._queue.qsize()
        while not self._queue.empty():
            self._metrics.dead_letters_dropped.labels(self._queue.get_nowait().reason).inc()
        if left:
            log.warning("stopping: %d dead letters not written in %.0f s, dropped", left, STOP_DRAIN_S)

    async def _write(self, letter: Letter) -> None:
        klass, tenant = self._origin(letter.subject)
        headers = {
            "Laneway-Reason": letter.reason,
            "Laneway-Detail": letter.detail,
            "Laneway-Subject": letter.subject,
            "Laneway-Attempt": str(letter.attempt),
        }
        try:
            body = await self._record(letter.data, self._decode(letter.data), tenant, headers)
            await self._nc.jetstream().publish(self.s.dlq(klass, tenant), body, headers=headers)
        except nats.errors.Error as exc:  # disconnected, or JetStream did not answer
            self._metrics.dead_letters_dropped.labels(letter.reason).inc()
            self._warn.warning("unwritten", "a dead letter could not be written: %r", exc)
        except Exception:
            # A bug, not a lost connection: count it and keep writing the others.
            self._metrics.dead_letters_dropped.labels(letter.reason).inc()
            log.exception("writing a dead letter failed")

    async def on_max_deliveries(self, msg: Msg) -> None:
        """Every attempt died without an answer: dead-letter it, tell the client, and remove it
        so it stops counting against the tenant's backlog."""
        try:
            seq = int(json.loads(msg.data)["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        js = self._nc.jetstream()
        try:
            stored = await js.get_msg(self.s.req_stream, seq)
        except nats.js.errors.NotFoundError:
            return  # already acked or removed
        assert stored.subject is not None  # a stored message has its subject
        self._metrics.dead_lettered.labels("max_deliver").inc()
        klass, tenant = self._origin(stored.subject)
        headers = {
            "Laneway-Reason": "max_deliver",
            "Laneway-Subject": stored.subject,
            "Laneway-Detail": f"no attempt finished in {self._max_deliver} deliveries",
        }
        request = self._decode(stored.data or b"")
        body = await self._record(stored.data or b"", request, tenant, headers)
        await js.publish(self.s.dlq(klass, tenant), body, headers=headers)
        # Never answer on a reply subject the request was not entitled to.
        if request is not None and self._entitled(request, klass, tenant):
            error = StreamError(
                request.request_id,
                self._max_deliver,
                0,
                ErrorCode.engine_error.value,
                "the request failed on every delivery attempt",
            )
            await self._nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))
            await self._on_removed(tenant, request.request_id)
        await js.delete_msg(self.s.req_stream, seq)
        self._warn.warning("max_deliver", "dead-lettered stream message %d after max deliveries", seq)
