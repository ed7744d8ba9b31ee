"""The broker's I/O loop: JetStream consumer → gate → lanes ↔ worker pulls.

Requests stay unacked in JetStream while they wait here (the broker sends in-progress acks so
they are not redelivered); a `Dispatch` hands the message's ack subject to the worker, which
acks when it finishes. If a worker dies, JetStream redelivers after `ack_wait` and the request
comes back through here with a higher attempt number. Nothing is lost by a broker restart
either: its lanes are rebuilt from the unacked messages.

What it holds per pool is in `pools.py`; the periodic upkeep (expiry, in-progress acks, pulls
whose hold is up, gauges) is `sweep.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.config import BrokerConfig
from broker.deadletter import DeadLetters
from broker.runtime.response_cache import CacheScope, ResponseCache, prefix_salt, replay_entries
from broker.gate.pii import PiiAudit, encode_audit
from broker.gate.pii_service import start_pii
from broker.gate.pipeline import Admission, Gate
from broker.gate.quota import Quota
from broker.intake import PullIntake
from broker.lanes import Admit, Item, Lanes
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics
from broker.pools import Held, ParkedPull, Pool
from broker.refusal import Refusal
from broker.runtime.connect import connect
from broker.runtime.tasks import beat_forever, cancel_and_wait
from broker.sweep import Sweep
from broker.topology import ensure_topology
from broker.usage.metrics import UsageMetrics
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import StreamError, TokenFrame
from schemas.requests import GenerateRequest
from schemas.subjects import BadToken
from schemas.usage import Usage
from schemas.work import Batch, Credit, Dispatch

log = logging.getLogger("laneway.broker")

BROKER_HEARTBEAT_S = 2.0

# A Dispatch's fields around its request, and the Batch around them, stay well under this.
DISPATCH_OVERHEAD_BYTES = 256

_ADMIT_ERRORS = {
    Admit.QUEUE_FULL: (ErrorCode.queue_full, "this tenant's queue for the class is full"),
    Admit.UNKNOWN_CLASS: (ErrorCode.unknown_class, "unknown priority class"),
    Admit.EXPIRED: (ErrorCode.deadline_exceeded, "the request's deadline passed before it could start"),
}


class Broker:
    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics | None = None) -> None:
        self.config = config
        self.s = config.nats.subjects
        self.metrics = metrics or BrokerMetrics()
        self.live = LiveConfig(on_classes=self._apply_classes, on_catalogue=self._catalogue_changed)
        self.gate = Gate(self.s)
        self.id = uuid.uuid4().hex[:12]
        self.usage_metrics = UsageMetrics(self.metrics.registry)
        self._scopes = CacheScope()                 # tenant → cache scope, also the prefix salt's
        self._dead: DeadLetters | None = None
        self._pools: dict[str, Pool] = {}
        self._recent_cancels: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._nc: Client | None = None
        self._intake: PullIntake | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list = []

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n.url, "laneway-broker", n.user, n.password)
        js = self._nc.jetstream()
        await ensure_topology(js, self.s, self.config.limits)
        await self._start_gate(js)
        self._dead = DeadLetters(self._nc, self.s, self.metrics, self.config.limits.max_deliver,
                                 self._release, self.gate, self.live.tenants)
        await self.live.start(js, self.s)
        self._subs = [
            await self._nc.subscribe(self.s.worker_events, cb=self.live.on_heartbeat),
            await self._nc.subscribe(self.s.pull_all, queue="laneway-brokers", cb=self._on_pull),
            await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel),
            # One replica handles each: a request that hit max_deliver goes to the DLQ once.
            await self._nc.subscribe(self._dead.advisory_subject, queue="laneway-brokers",
                                     cb=self._dead.on_max_deliveries),
            # Every replica releases the quota grants it holds; metrics count each record once.
            await self._nc.subscribe(self.s.usage_all, cb=self._on_usage),
            await self._nc.subscribe(self.s.usage_all, queue="laneway-usage-metrics",
                                     cb=self._count_usage),
        ]
        await self._nc.publish(self.s.worker_ping, b"")
        await self._nc.subscribe(self.s.worker_ping, cb=self._announce)
        self._intake = PullIntake(self._nc, self.s.req_stream, self.s.broker_durable,
                                  self._on_request, room=self._room)
        await self._intake.start()
        sweep = Sweep(self._nc, self._pools, self.live, self.metrics, self.gate, self._recent_cancels,
                      self._expire, self._serve_parked, self._poke_intake,
                      self.config.sweep_interval_s, self.config.limits.ack_wait_s / 3)
        self._tasks = [asyncio.create_task(sweep.run(), name="laneway-sweep"),
                       asyncio.create_task(beat_forever(self._announce, BROKER_HEARTBEAT_S),
                                           name="broker-heartbeats")]
        log.info("broker ready: classes=%s pools=%s", sorted(self.live.classes), sorted(self._pool_names()))

    async def _start_gate(self, js) -> None:
        cfg = self.config
        if cfg.quotas:
            self.gate.quota = await Quota.open(js, self.s, cfg.limits.replicas)
            await self.gate.quota.start()
        if cfg.cache_ttl_s > 0:
            self.gate.cache = await ResponseCache.open(js, self.s, cfg.cache_ttl_s,
                                                      replicas=cfg.limits.replicas)
        if cfg.pii != "off":
            self.gate.use_pii(await start_pii(cfg.pii, cfg.pii_workers), self._publish_audit)

    async def _publish_audit(self, tenant: str, audit: PiiAudit) -> None:
        await self._nc.publish(self.s.audit(tenant), encode_audit(audit))

    async def stop(self) -> None:
        """Stop taking work; answer parked pulls; hand waiting requests back to JetStream (nak)
        so another broker replica takes them at once instead of after ack_wait."""
        if self._intake:
            await self._intake.stop()
        await cancel_and_wait(*self._tasks)
        await self.live.stop()
        if self.gate.quota is not None:
            await self.gate.quota.close()     # unused leases go back to the other replicas
        if self.gate.pii is not None:
            await self.gate.pii.close()
        if self._nc is None:
            return
        if self._nc.is_connected:
            for pool in self._pools.values():
                for parked in pool.parked:
                    await self._nc.publish(parked.reply, codec.encode(Batch()))
                pool.parked.clear()
                for item in pool.lanes.waiting_items():
                    pool.lanes.forget(item.tenant, item.request_id)
                    await item.payload.msg.nak()
            await self._nc.drain()
        else:
            await self._nc.close()
        self._nc = None

    async def __aenter__(self) -> "Broker":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- what live config changes ----------------------------------------------------------
    def _apply_classes(self) -> None:
        for pool in self._pools.values():
            pool.lanes.set_classes(self.live.classes.values())

    def _catalogue_changed(self) -> None:
        tenants = self.live.tenants
        self._scopes = CacheScope({t.name: t.cache_group for t in tenants if t.cache_group})
        if self.gate.cache is not None:
            self.gate.cache.scopes = self._scopes
        self.usage_metrics.set_known(tenants=[t.name for t in tenants], models=self.live.model_names())

    async def _announce(self, msg: Msg | None = None) -> None:
        """`lw.evt.broker.<id>`: edges count a broker consuming requests as part of readiness."""
        await self._nc.publish(self.s.broker_event(self.id), b"")

    def _pool_names(self) -> set[str]:
        return self.live.pool_names() | set(self._pools)

    def _pool(self, name: str) -> Pool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = Pool(Lanes(self.live.classes.values(), self.live.tenants.weight))
        return pool

    # -- intake ---------------------------------------------------------------------------
    def _room(self) -> int:
        return self.config.max_held - sum(len(p.lanes) for p in self._pools.values())

    def _poke_intake(self) -> None:
        if self._intake is not None and self._room() > 0:
            self._intake.poke()

    async def _on_request(self, msg: Msg) -> None:
        attempt = msg.metadata.num_delivered
        try:
            klass, tenant = self.s.parse_req(msg.subject)
            request = codec.decode_request(msg.data)
        except (BadToken, codec.DecodeError) as exc:
            await self._dead.unreadable(msg, "malformed", str(exc))
            return
        if self._recent_cancels.pop((tenant, request.request_id), None) is not None:
            await msg.term()
            return
        try:
            admission = await self.gate.admit(request, klass, tenant, attempt,
                                              self.live.tenants.get(tenant), self.live.routing())
        except Refusal as refusal:
            if refusal.param in ("tenant", "reply_to"):
                # Never answer on a reply subject the request was not entitled to.
                await self._dead.unreadable(msg, "invalid", refusal.message)
            else:
                await self._refuse(msg, request, attempt, refusal.code, refusal.message,
                                   refusal.param, refusal.headers)
            return
        decision = admission.decision
        self.metrics.routing_decisions.labels(decision.pool, decision.reason.value).inc()
        if decision.spilled:
            self.metrics.routing_fallback.labels(decision.pool, decision.reason.value).inc()
        if admission.hit is not None:
            await self._replay(msg, admission, attempt)
            return
        await self._enqueue(msg, admission, klass, tenant, attempt)

    async def _enqueue(self, msg: Msg, admission: Admission, klass: str, tenant: str,
                       attempt: int) -> None:
        request, pool_name = admission.request, admission.decision.pool
        pool = self._pool(pool_name)
        existing = pool.lanes.get(tenant, request.request_id)
        if existing is not None:
            # Redelivered while still waiting here (an in-progress ack came too late): keep
            # one entry, with the newest ack subject.
            existing.payload.msg = msg
            existing.payload.attempt = attempt
            return
        now = time.time()
        held = Held(msg, request, attempt, pool_name, time.monotonic(),
                    admission.cache_key or "", admission.served_model,
                    admission.decision.escalate_to or "", admission.headers)
        item = Item(request.request_id, tenant, klass, request.estimated_cost(), request.deadline,
                    now, payload=held, size=len(msg.data) + len(msg.reply) + DISPATCH_OVERHEAD_BYTES,
                    slots=request.choices)
        verdict = pool.lanes.admit(item, now)
        if verdict is not Admit.OK:
            code, text = _ADMIT_ERRORS[verdict]
            if verdict is Admit.EXPIRED:
                self.metrics.expired.labels(klass).inc()
            await self._refuse(msg, request, attempt, code, text)
            return
        await self._serve_parked(pool_name, pool)

    async def _replay(self, msg: Msg, admission: Admission, attempt: int) -> None:
        """A cache hit streams back as a normal stream, and is metered as cached."""
        request, hit = admission.request, admission.hit
        entries = replay_entries(hit, request.request_id, attempt, admission.headers)
        await self._nc.publish(request.reply_to, codec.encode(TokenFrame("cache", entries, time.time())))
        usage = Usage(request_id=request.request_id, tenant=request.tenant, klass=request.klass,
                      model=request.model, served_model=hit.served_model, pool=admission.decision.pool,
                      worker_id="cache", prompt_tokens=hit.prompt_tokens,
                      completion_tokens=hit.completion_tokens, finish_reason=hit.finish_reason,
                      queued_s=0.0, ttft_s=0.0, total_s=0.0, finished_at=time.time(), cached=True)
        await self._nc.publish(self.s.usage(request.tenant), codec.encode(usage))
        await msg.ack()

    async def _refuse(self, msg: Msg, request: GenerateRequest, attempt: int, code: ErrorCode,
                      message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.metrics.rejected.labels(code.value).inc()
        await msg.term()    # removed first, then the client is told
        error = StreamError(request.request_id, attempt, 0, code.value, message, param, headers or {})
        await self._nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))
        await self._release(request.tenant, request.request_id)

    async def _release(self, tenant: str, request_id: str, tokens: int = 0) -> None:
        await self.gate.release(tenant, request_id, tokens)

    async def _on_usage(self, msg: Msg) -> None:
        try:
            usage = codec.decode_usage(msg.data)
        except codec.DecodeError:
            return
        await self._release(usage.tenant, usage.request_id, usage.prompt_tokens + usage.completion_tokens)

    async def _count_usage(self, msg: Msg) -> None:
        try:
            self.usage_metrics.observe(codec.decode_usage(msg.data))
        except codec.DecodeError:
            pass

    # -- pulls ----------------------------------------------------------------------------
    async def _on_pull(self, msg: Msg) -> None:
        try:
            credit = codec.decode_credit(msg.data)
        except codec.DecodeError:
            log.warning("ignored a malformed pull on %s", msg.subject)
            return
        if not msg.reply:
            return
        pool = self._pool(credit.pool)
        # A worker's fresh credit supersedes its parked one (its room changed meanwhile).
        superseded = [p for p in pool.parked if p.credit.worker_id == credit.worker_id]
        if superseded:
            pool.parked = [p for p in pool.parked if p.credit.worker_id != credit.worker_id]
            for old in superseded:
                await self._nc.publish(old.reply, codec.encode(Batch()))
        if await self._answer(pool, credit, msg.reply):
            return
        until = time.monotonic() + max(0.0, min(credit.wait_s, 30.0))
        pool.parked.append(ParkedPull(credit, msg.reply, until))
        self.metrics.parked_pulls.labels(credit.pool).set(len(pool.parked))

    async def _answer(self, pool: Pool, credit: Credit, reply: str) -> bool:
        """Reply to a pull if there is work for it; False leaves it for the caller to park."""
        now = time.time()
        selection = pool.lanes.select(
            free_slots=credit.free_slots, token_budget=credit.token_budget,
            total_slots=credit.total_slots, running=credit.running, classes=credit.classes,
            now=now, max_bytes=self._nc.max_payload - DISPATCH_OVERHEAD_BYTES,
        )
        for item in selection.expired:
            await self._expire(item)
        if not selection.dispatch:
            return False
        dispatches = []
        for item in selection.dispatch:
            held: Held = item.payload
            policy = pool.lanes.policy(item.klass)
            queued = now - item.enqueued_at
            dispatches.append(Dispatch(held.request, held.msg.reply, held.attempt,
                                       priority=policy.rank if policy else 0, queued_s=queued,
                                       max_deliver=self.config.limits.max_deliver,
                                       cache_key=held.cache_key, cache_model=held.cache_model,
                                       cache_salt=prefix_salt(self._scopes.scope(item.tenant)),
                                       headers=held.headers,
                                       **self._cascade(held)))
            self.metrics.queue_wait.labels(item.klass).observe(queued)
            # The broker sees no first tokens; queue wait is the part of TTFT that saturation grows.
            self.live.health.observe_ttft(credit.pool, queued)
            self.metrics.dispatched.labels(credit.pool, item.klass).inc()
        self.metrics.batch_size.labels(credit.pool).observe(len(dispatches))
        await self._nc.publish(reply, codec.encode(Batch(dispatches)))
        return True

    def _cascade(self, held: Held) -> dict:
        """Dispatch fields for a request its rule may escalate: the verdict settings."""
        rules = self.live.rules
        if not held.escalate_to or rules is None:
            return {}
        c = rules.cascade
        return {"escalate_to": held.escalate_to, "cascade_window": c.window,
                "cascade_min_logprob": c.min_mean_logprob}

    async def _serve_parked(self, name: str, pool: Pool) -> None:
        while pool.parked and len(pool.lanes):
            parked = pool.parked.pop(0)
            if not await self._answer(pool, parked.credit, parked.reply):
                pool.parked.insert(0, parked)
                break
        self.metrics.parked_pulls.labels(name).set(len(pool.parked))

    # -- cancels, expiry ---------------------------------------------------------------------
    async def _on_cancel(self, msg: Msg) -> None:
        try:
            cancel = codec.decode_cancel(msg.data)
        except codec.DecodeError:
            return
        for pool in self._pools.values():
            item = pool.lanes.cancel(cancel.tenant, cancel.request_id)
            if item is not None:
                self.metrics.cancelled.labels(item.klass).inc()
                await item.payload.msg.term()
                await self._release(cancel.tenant, cancel.request_id)
                return
        # Not here (yet): remember it briefly in case its message is still on the way.
        self._recent_cancels[(cancel.tenant, cancel.request_id)] = time.monotonic()
        while len(self._recent_cancels) > 10_000:
            self._recent_cancels.popitem(last=False)

    async def _expire(self, item: Item) -> None:
        held: Held = item.payload
        self.metrics.expired.labels(item.klass).inc()
        await self._refuse(held.msg, held.request, held.attempt, ErrorCode.deadline_exceeded,
                           "the request's deadline passed before it could start")
