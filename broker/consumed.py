"""What a gating broker does with each request its intake consumes: read it (an unreadable one is
a dead letter), drop it if its cancel came first, admit it through the gate beside other tenants'
admissions (`admitting.py`), then refuse it, answer it from the cache, or hand it to the scheduler
(`Origin`). The broker builds it once connected; `Intakes` calls `on_request`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.admitting import Admitting
from broker.deadletter import DeadLetters
from broker.gate.pipeline import Admission, Delivery, Gate
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics
from broker.received import Copy
from broker.scheduler.answers import refuse, replay
from broker.scheduler.origin import Origin
from core.policy.refusal import Refusal
from core.tracing import Tracing, tracer
from schemas import codec
from schemas.requests import GenerateRequest
from schemas.subjects import MSG_ID_HEADER, BadToken, Subjects
from schemas.work import Admitted


@dataclass
class Consumed:
    nc: Client
    s: Subjects
    broker_id: str
    metrics: BrokerMetrics
    gate: Gate
    live: LiveConfig
    dead: DeadLetters
    origin: Origin
    admitting: Admitting
    take_cancel: Callable[[str, str], bool]  # whether a cancel came before the request (and forget it)
    release: Callable[[str, str], Awaitable[None]]
    tracing: Tracing = field(default_factory=tracer)

    async def on_request(self, msg: Msg) -> bool:  # False: junk, its sender's pull waits
        metadata = msg.metadata
        attempt = metadata.num_delivered
        try:
            klass, tenant, escalated = self.s.parse_req(msg.subject)
            request = codec.decode_request(msg.data)
        except (BadToken, codec.DecodeError) as exc:
            await self.dead.unreadable(msg, "malformed", str(exc))
            return False
        if self.take_cancel(tenant, request.request_id):
            self.metrics.cancelled.labels(klass).inc()  # the cancel came first: it never runs
            await msg.term()
            return True
        delivery = Delivery(attempt, metadata.sequence.stream, (msg.headers or {}).get(MSG_ID_HEADER), escalated)
        # Off the subscription's one task: another tenant's next message need not wait for this one.
        self.admitting.submit(
            tenant, request.request_id, self.live.rank(klass), lambda: self.admit(msg, request, klass, tenant, delivery)
        )
        return True

    async def admit(self, msg: Msg, request: GenerateRequest, klass: str, tenant: str, delivery: Delivery) -> None:
        attempt, began = delivery.attempt, time.time()
        try:
            admission = await self.gate.admit(
                request, klass, tenant, delivery, self.live.tenants.get(tenant), self.live.routing()
            )
        except Copy:  # of a message received: that one answers on the same reply subject
            return await msg.term()
        except Refusal as refusal:
            self._trace(request, tenant, attempt, began, refused=refusal.code.value)
            if refusal.param in ("tenant", "reply_to"):
                # Never answer on a reply subject the request was not entitled to.
                await self.dead.unreadable(msg, "invalid", refusal.message)
            else:
                # The gate gave back what it charged: nothing is released by id here.
                await refuse(
                    self.nc,
                    self.metrics,
                    msg,
                    request,
                    attempt,
                    refusal.code,
                    refusal.message,
                    refusal.param,
                    refusal.headers,
                )
            return
        decision = admission.decision
        self._trace(
            request,
            tenant,
            attempt,
            began,
            pool=decision.pool,
            route=decision.reason.value,
            cached=admission.hit is not None,
        )
        self.metrics.routing_decisions.labels(decision.pool, decision.reason.value).inc()
        if decision.spilled:
            self.metrics.routing_fallback.labels(decision.pool, decision.reason.value).inc()
        if self.take_cancel(tenant, request.request_id):
            # Cancelled while the gate had it (a PII analysis, a quota round trip): it never runs.
            await self.release(tenant, request.request_id)
            self.metrics.cancelled.labels(klass).inc()
            await msg.term()
            return
        if admission.hit is not None:
            await replay(
                self.nc,
                self.s,
                msg,
                admission.request,
                admission.hit,
                attempt,
                admission.headers,
                admission.decision.pool,
            )
            return
        await self.origin.admit(self.admitted(msg, admission, attempt), msg)

    def _trace(self, request: GenerateRequest, tenant: str, attempt: int, began: float, **outcome: Any) -> None:
        """The gate's span: admitted (where to, cached) or refused (why)."""
        self.tracing.record(
            "laneway.broker.admit",
            request.traceparent,
            began,
            request_id=request.request_id,
            tenant=tenant,
            attempt=attempt,
            **outcome,
        )

    def admitted(self, msg: Msg, admission: Admission, attempt: int) -> Admitted:
        return Admitted(
            admission.request,
            msg.reply,
            attempt,
            admission.decision.pool,
            self.broker_id,
            admission.cache_key or "",
            admission.served_model,
            admission.decision.escalate_to or "",
            admission.headers,
            admission.output_pii,
            admission.adapter,
        )
