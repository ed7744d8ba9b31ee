"""The broker's I/O loop: JetStream consumer → gate → lanes ↔ worker pulls.

Requests stay unacked in JetStream while they wait here (the broker sends in-progress acks so
they are not redelivered); a `Dispatch` hands the message's ack subject to the worker, which
acks when it finishes. If a worker dies, JetStream redelivers after `ack_wait` and the request
comes back through here with a higher attempt number. Nothing is lost by a broker restart
either: its lanes are rebuilt from the unacked messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import classes as class_docs
from broker import tenants as tenant_docs
from broker.config import BrokerConfig, LogicalModel
from broker.gate import Refusal
from broker.gate.route import route
from broker.gate.validate import validate
from broker.intake import PullIntake
from broker.lanes import Admit, Item, Lanes
from broker.livecfg import BucketWatch
from broker.metrics import BrokerMetrics
from broker.models import decode_models
from broker.routing import rules as rule_docs
from broker.routing.health import HealthBoard
from broker.routing.rules import PoolHealth, RuleSet
from broker.routing.store import is_rules_key
from broker.tenants import TenantDirectory
from broker.topology import ensure_topology
from laneway.connect import connect
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import StreamError, TokenFrame
from schemas.requests import GenerateRequest
from schemas.subjects import BadToken
from schemas.work import Batch, Credit, Dispatch

log = logging.getLogger("laneway.broker")

# A Dispatch's fields around its request, and the Batch around them, stay well under this.
DISPATCH_OVERHEAD_BYTES = 256

_ADMIT_ERRORS = {
    Admit.QUEUE_FULL: (ErrorCode.queue_full, "this tenant's queue for the class is full"),
    Admit.UNKNOWN_CLASS: (ErrorCode.unknown_class, "unknown priority class"),
    Admit.EXPIRED: (ErrorCode.deadline_exceeded, "the request's deadline passed before it could start"),
}


@dataclass(slots=True)
class Held:
    """A waiting request and the JetStream message that stores it."""

    msg: Msg
    request: GenerateRequest
    attempt: int
    pool: str
    last_touch: float       # monotonic time of the last in-progress ack


@dataclass(slots=True)
class _ParkedPull:
    credit: Credit
    reply: str
    until: float


@dataclass
class _Pool:
    lanes: Lanes
    parked: list[_ParkedPull] = field(default_factory=list)


class Broker:
    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics | None = None) -> None:
        self.config = config
        self.s = config.nats.subjects
        self.metrics = metrics or BrokerMetrics()
        self.tenants = TenantDirectory()
        self.models: dict[str, LogicalModel] = {}
        self.rules: RuleSet | None = None
        self.health = HealthBoard()
        self._health: dict[str, PoolHealth] = {}
        self._classes: dict[str, class_docs.ClassPolicy] = {}
        self._pools: dict[str, _Pool] = {}
        self._recent_cancels: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._nc: Client | None = None
        self._intake: PullIntake | None = None
        self._watches: list[BucketWatch] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list = []

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n.url, "laneway-broker", n.user, n.password)
        js = self._nc.jetstream()
        await ensure_topology(js, self.s, self.config.limits)
        self._watches = [
            BucketWatch(js, self.s.bucket("classes"), self._put_class, self._delete_class),
            BucketWatch(js, self.s.bucket("tenants"), self._put_tenant, self.tenants.remove),
            BucketWatch(js, self.s.bucket("routing"), self._put_routing, self._delete_routing),
        ]
        for watch in self._watches:
            await watch.start()
        self._subs = [
            await self._nc.subscribe(self.s.worker_events, cb=self._on_heartbeat),
            await self._nc.subscribe(self.s.pull_all, queue="laneway-brokers", cb=self._on_pull),
            await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel),
            # One replica handles each: a request that hit max_deliver goes to the DLQ once.
            await self._nc.subscribe(
                f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.s.req_stream}.{self.s.broker_durable}",
                queue="laneway-brokers", cb=self._on_max_deliveries),
        ]
        await self._nc.publish(self.s.worker_ping, b"")
        self._intake = PullIntake(self._nc, self.s.req_stream, self.s.broker_durable,
                                  self._on_request, room=self._room)
        await self._intake.start()
        self._tasks = [asyncio.create_task(self._sweep(), name="laneway-sweep")]
        log.info("broker ready: classes=%s pools=%s", sorted(self._classes), sorted(self._pool_names()))

    async def stop(self) -> None:
        """Stop taking work; answer parked pulls; hand waiting requests back to JetStream (nak)
        so another broker replica takes them at once instead of after ack_wait."""
        if self._intake:
            await self._intake.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for watch in self._watches:
            await watch.stop()
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

    # -- live config ----------------------------------------------------------------------
    def _put_class(self, name: str, value: bytes) -> None:
        self._classes[name] = class_docs.decode(name, value)
        self._apply_classes()
        log.info("applied class %s", name)

    def _delete_class(self, name: str) -> None:
        self._classes.pop(name, None)
        self._apply_classes()
        log.info("removed class %s", name)

    def _apply_classes(self) -> None:
        for pool in self._pools.values():
            pool.lanes.set_classes(self._classes.values())

    def _put_tenant(self, name: str, value: bytes) -> None:
        self.tenants.put(tenant_docs.decode(name, value))
        log.info("applied tenant %s", name)

    def _put_routing(self, key: str, value: bytes) -> None:
        if key == "models":
            self.models = decode_models(value)
            log.info("applied models: %s", sorted(self.models))
        elif is_rules_key(key):
            self.rules = rule_docs.decode(value)
            log.info("applied routing rules version %d", self.rules.version)

    def _delete_routing(self, key: str) -> None:
        if is_rules_key(key):
            self.rules = None
            log.info("routing rules removed; models table only")

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            self.health.on_heartbeat(codec.decode_heartbeat(msg.data))
        except codec.DecodeError:
            return
        self._health = self.health.snapshot()

    def _pool_names(self) -> set[str]:
        names = {m.pool for m in self.models.values()} | set(self._pools)
        return names | set(self.rules.pools) if self.rules else names

    def _pool(self, name: str) -> _Pool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = _Pool(Lanes(self._classes.values(), self.tenants.weight))
        return pool

    # -- intake ---------------------------------------------------------------------------
    def _room(self) -> int:
        return self.config.max_held - sum(len(p.lanes) for p in self._pools.values())

    async def _on_request(self, msg: Msg) -> None:
        attempt = msg.metadata.num_delivered
        try:
            klass, tenant = self.s.parse_req(msg.subject)
            request = codec.decode_request(msg.data)
        except (BadToken, codec.DecodeError) as exc:
            await self._dead_letter(msg, "malformed", str(exc))
            return
        now = time.time()
        try:
            validate(request, klass, tenant, self.s)
            decision = route(request, self.models, self.rules, self._health)
        except Refusal as refusal:
            if refusal.param in ("tenant", "reply_to"):
                # Never answer on a reply subject the request was not entitled to.
                await self._dead_letter(msg, "invalid", refusal.message)
            else:
                await self._refuse(msg, request, attempt, refusal.code, refusal.message)
            return
        if self._recent_cancels.pop((tenant, request.request_id), None) is not None:
            await msg.term()
            return
        pool_name = decision.pool
        self.metrics.routing_decisions.labels(pool_name, decision.reason.value).inc()
        if decision.spilled:
            self.metrics.routing_fallback.labels(pool_name, decision.reason.value).inc()
        pool = self._pool(pool_name)
        existing = pool.lanes.get(tenant, request.request_id)
        if existing is not None:
            # Redelivered while still waiting here (an in-progress ack came too late): keep
            # one entry, with the newest ack subject.
            existing.payload.msg = msg
            existing.payload.attempt = attempt
            return
        mono = time.monotonic()
        item = Item(request.request_id, tenant, klass, request.estimated_cost(), request.deadline,
                    now, payload=Held(msg, request, attempt, pool_name, mono),
                    size=len(msg.data) + len(msg.reply) + DISPATCH_OVERHEAD_BYTES)
        verdict = pool.lanes.admit(item, now)
        if verdict is not Admit.OK:
            code, text = _ADMIT_ERRORS[verdict]
            if verdict is Admit.EXPIRED:
                self.metrics.expired.labels(klass).inc()
            await self._refuse(msg, request, attempt, code, text)
            return
        await self._serve_parked(pool_name, pool)

    async def _refuse(self, msg: Msg, request: GenerateRequest, attempt: int,
                      code: ErrorCode, message: str) -> None:
        self.metrics.rejected.labels(code.value).inc()
        error = StreamError(request.request_id, attempt, 0, code.value, message)
        await self._nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))
        await msg.term()

    async def _dead_letter(self, msg: Msg, reason: str, detail: str) -> None:
        self.metrics.dead_lettered.labels(reason).inc()
        try:
            klass, tenant = self.s.parse_req(msg.subject)
        except BadToken:
            klass, tenant = "unknown", "unknown"
        log.warning("dead-lettered a request on %s: %s", msg.subject, reason)
        headers = {"Laneway-Reason": reason, "Laneway-Detail": detail[:512],
                   "Laneway-Subject": msg.subject,
                   "Laneway-Attempt": str(msg.metadata.num_delivered)}
        await self._nc.jetstream().publish(self.s.dlq(klass, tenant), msg.data, headers=headers)
        await msg.term()

    async def _on_max_deliveries(self, msg: Msg) -> None:
        """Every attempt died without an answer (e.g. workers crashing on it): dead-letter it,
        tell the client, and remove it so it stops counting against the tenant's backlog."""
        try:
            seq = int(json.loads(msg.data)["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        js = self._nc.jetstream()
        try:
            stored = await js.get_msg(self.s.req_stream, seq)
        except nats.js.errors.NotFoundError:
            return  # already acked or removed
        self.metrics.dead_lettered.labels("max_deliver").inc()
        headers = {"Laneway-Reason": "max_deliver", "Laneway-Subject": stored.subject,
                   "Laneway-Detail": f"no attempt finished in {self.config.limits.max_deliver} deliveries"}
        try:
            klass, tenant = self.s.parse_req(stored.subject)
        except BadToken:
            klass, tenant = "unknown", "unknown"
        await js.publish(self.s.dlq(klass, tenant), stored.data or b"", headers=headers)
        try:
            request = codec.decode_request(stored.data or b"")
            validate(request, klass, tenant, self.s)
        except (codec.DecodeError, Refusal):
            pass
        else:
            error = StreamError(request.request_id, self.config.limits.max_deliver, 0,
                                ErrorCode.engine_error.value,
                                "the request failed on every delivery attempt")
            await self._nc.publish(request.reply_to, codec.encode(TokenFrame("broker", [error])))
        await js.delete_msg(self.s.req_stream, seq)
        log.warning("dead-lettered stream message %d after max deliveries", seq)

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
        pool.parked.append(_ParkedPull(credit, msg.reply, until))
        self.metrics.parked_pulls.labels(credit.pool).set(len(pool.parked))

    async def _answer(self, pool: _Pool, credit: Credit, reply: str) -> bool:
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
                                       max_deliver=self.config.limits.max_deliver))
            self.metrics.queue_wait.labels(item.klass).observe(queued)
            # The broker sees no first tokens; queue wait is the part of TTFT that saturation grows.
            self.health.observe_ttft(credit.pool, queued)
            self.metrics.dispatched.labels(credit.pool, item.klass).inc()
        self.metrics.batch_size.labels(credit.pool).observe(len(dispatches))
        await self._nc.publish(reply, codec.encode(Batch(dispatches)))
        return True

    async def _serve_parked(self, name: str, pool: _Pool) -> None:
        while pool.parked and len(pool.lanes):
            parked = pool.parked.pop(0)
            if not await self._answer(pool, parked.credit, parked.reply):
                pool.parked.insert(0, parked)
                break
        self.metrics.parked_pulls.labels(name).set(len(pool.parked))

    # -- cancels, expiry, liveness --------------------------------------------------------
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

    async def _sweep(self) -> None:
        touch_every = self.config.limits.ack_wait_s / 3
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            now, mono = time.time(), time.monotonic()
            try:
                for name, pool in self._pools.items():
                    for item in pool.lanes.expire(now):
                        await self._expire(item)
                    for item in pool.lanes.waiting_items():
                        held: Held = item.payload
                        if mono - held.last_touch >= touch_every:
                            held.last_touch = mono
                            await held.msg.in_progress()
                    # Answer pulls whose hold time is up, before the worker's request times out.
                    keep = []
                    for parked in pool.parked:
                        if parked.until <= mono:
                            await self._nc.publish(parked.reply, codec.encode(Batch()))
                        else:
                            keep.append(parked)
                    pool.parked = keep
                    await self._serve_parked(name, pool)
                    for klass, depth in pool.lanes.depths().items():
                        self.metrics.queue_depth.labels(name, klass).set(depth)
                    self.health.set_queue_depth(name, len(pool.lanes))
                self._health = self.health.snapshot()
                for name, h in self._health.items():
                    self.metrics.ready_workers.labels(name).set(h.ready_workers)
                cutoff = mono - 60
                while self._recent_cancels and next(iter(self._recent_cancels.values())) < cutoff:
                    self._recent_cancels.popitem(last=False)
            except Exception:
                # Disconnected mid-sweep: the next sweep retries; the loop must not die.
                log.exception("sweep failed")
            if self._intake is not None and self._room() > 0:
                self._intake.poke()
