"""Dead letters: requests that cannot be served go to `LW_DLQ` with their reason, once.

Two ways in: a message the broker cannot even read (malformed, or a subject/payload mismatch),
and JetStream's MAX_DELIVERIES advisory for a request whose every delivery died without an
answer (workers crashing on it). Records carry headers naming the reason; the client, where it
can be told safely, gets an `engine_error`.

A record outlives the request (LW_DLQ keeps it for days), so with the PII stage on it never holds
the raw text: it holds the request as the gate lets it on, redacted under the tenant's policy
(the worker's own dead letters carry the admitted request, already redacted). A body that cannot
be decoded or analysed is withheld: the record keeps its size (`Laneway-Body: withheld`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.gate.pipeline import Gate
from broker.gate.validate import validate
from broker.metrics import BrokerMetrics
from core.policy.refusal import Refusal
from core.policy.tenants import TenantDirectory
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import StreamError, TokenFrame
from schemas.requests import GenerateRequest
from schemas.subjects import BadToken, Subjects

log = logging.getLogger("laneway.dlq")


class DeadLetters:
    def __init__(self, nc: Client, s: Subjects, metrics: BrokerMetrics, max_deliver: int,
                 on_removed: Callable[[str, str], Awaitable[None]], gate: Gate,
                 tenants: TenantDirectory) -> None:
        self._nc = nc
        self.s = s
        self._metrics = metrics
        self._max_deliver = max_deliver
        self._on_removed = on_removed      # (tenant, request_id): give back what it held
        self._gate = gate                  # its PII stage redacts what a record keeps
        self._tenants = tenants

    @property
    def advisory_subject(self) -> str:
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.s.req_stream}.{self.s.broker_durable}"

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

    async def _record(self, data: bytes, request: GenerateRequest | None, tenant: str,
                      headers: dict[str, str]) -> bytes:
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
        """Park a message the broker cannot serve, then terminate it."""
        self._metrics.dead_lettered.labels(reason).inc()
        klass, tenant = self._origin(msg.subject)
        log.warning("dead-lettered a request on %s: %s", msg.subject, reason)
        headers = {"Laneway-Reason": reason, "Laneway-Detail": detail[:512],
                   "Laneway-Subject": msg.subject, "Laneway-Attempt": str(msg.metadata.num_delivered)}
        body = await self._record(msg.data, self._decode(msg.data), tenant, headers)
        await self._nc.jetstream().publish(self.s.dlq(klass, tenant), body, headers=headers)
        await msg.term()

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
        self._metrics.dead_lettered.labels("max_deliver").inc()
        klass, tenant = self._origin(stored.subject)
        headers = {"Laneway-Reason": "max_deliver", "Laneway-Subject": stored.subject,
                   "Laneway-Detail": f"no attempt finished in {self._max_deliver} deliveries"}
        request = self._decode(stored.data or b"")
        body = await self._record(stored.data or b"", request, tenant, headers)
        await js.publish(self.s.dlq(klass, tenant), body, headers=headers)
        # Never answer on a reply subject the request was not entitled to.
        if request is not None and self._entitled(request, klass, tenant):
            error = StreamError(request.request_id, self._max_deliver, 0, ErrorCode.engine_error.value,
                                "the request failed on every delivery attempt")
            await self._nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))
            await self._on_removed(tenant, request.request_id)
        await js.delete_msg(self.s.req_stream, seq)
        log.warning("dead-lettered stream message %d after max deliveries", seq)
