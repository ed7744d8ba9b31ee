"""The broker's I/O loop: JetStream consumer → gate → the scheduler's lanes ↔ worker pulls.

Every broker gates the requests it consumes (validate, quota, PII, route, cache: the CPU-heavy
part, so N brokers share it). One of them at a time holds the scheduler lease and keeps the
lanes of every pool; only it answers worker pulls (`broker/scheduler/`). While another broker is
alive the scheduler consumes nothing itself: what it admitted would die with it. Alone, it does
everything.

Requests stay unacked in JetStream while they wait (the scheduler sends in-progress acks so
they are not redelivered); a `Dispatch` hands the message's ack subject to the worker, which
acks when it finishes. If a worker dies, JetStream redelivers after `ack_wait` and the request
comes back through a gate with a higher attempt number. If the scheduler dies, a standby takes
the lease and every gate sends it the requests it admitted that have not settled.

The periodic upkeep (expiry, in-progress acks, pulls whose hold is up, gauges) is `sweep.py`;
each consumed request's way through the gate to the scheduler, `consumed.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from typing import TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.admitting import Admitting
from broker.config import BrokerConfig
from broker.consumed import Consumed
from broker.deadletter import DeadLetters
from broker.gate.pii import encode_audit
from broker.gate.pii.service import start_pii
from broker.gate.pipeline import Gate
from broker.gate.quota import Quota
from broker.holdings import Holdings
from broker.intakes import Intakes
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics, UsageMetrics
from broker.received import Received
from broker.scheduler.lease import Lease, open_lease_bucket
from broker.scheduler.origin import Origin
from broker.scheduler.peers import Peers
from broker.scheduler.schedule import Scheduler
from broker.sweep import Sweep, running_ended
from core.cache import CacheScope, ResponseCache
from core.connect import connect, disconnect
from core.provision import wait_provisioned
from core.tasks import beat_forever, cancel_and_wait
from schemas import codec
from schemas.subjects import BadToken
from schemas.work import BrokerBeat

log = logging.getLogger("laneway.broker")

BROKER_HEARTBEAT_S = 1.0
# A broker silent this long is gone. With two brokers, the scheduler consumes again only then
# after its peer was SIGKILLed: short, but past a missed beat or two on a busy machine.
PEER_STALE_S = 3.5 * BROKER_HEARTBEAT_S
T = TypeVar("T")


def _started(part: T | None) -> T:
    if part is None:  # a part start() makes, asked for before it (by a callback that came first)
        raise RuntimeError("Broker.start() first")
    return part


class Broker:
    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics | None = None) -> None:
        self.config = config
        self.s = config.nats.subjects
        self.metrics = metrics or BrokerMetrics()
        self.live = LiveConfig(on_classes=self._apply_classes, on_catalogue=self._catalogue_changed)
        self.gate = Gate(self.s, max_context_tokens=config.max_context_tokens, rank_of=self.live.rank)
        self.id = uuid.uuid4().hex[:12]
        self.usage_metrics = UsageMetrics(self.metrics.registry)
        self.peers = Peers(self.id, PEER_STALE_S)
        self._leader = ""  # the scheduler last announced
        self.gating = False  # consuming requests now
        self._scopes = CacheScope()  # tenant → cache scope, also the prefix salt's
        self._dead: DeadLetters | None = None
        self._recent_cancels: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._nc: Client | None = None
        self.scheduler: Scheduler | None = None
        self._origin: Origin | None = None
        self._lease: Lease | None = None
        self._intake: Intakes | None = None
        self._held: Holdings | None = None
        self._consumed: Consumed | None = None  # each request the intake consumes, through the gate
        self._retiring: set[asyncio.Task[None]] = set()  # intakes stopping (draining) in the background
        self._admitting = Admitting(on_ended=self._poke_intake)  # what the intake handed over, in the gate
        self._stopping = False
        self._roles = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list = []

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n, cfg = self.config.nats, self.config
        self._stopping = False
        self._nc = await connect(n, "laneway-broker")
        js = self._nc.jetstream()
        await wait_provisioned(js, self.s, "broker", requests=True)  # `laneway up` / `ops provision`
        await self._start_gate(js)
        self._dead = DeadLetters(
            self._nc, self.s, self.metrics, self.config.limits.max_deliver, self._release, self.gate, self.live.tenants
        )
        await self.live.start(js, self.s)
        self.scheduler = Scheduler(
            self._nc,
            self.s,
            self.id,
            cfg.limits.max_deliver,
            self.live,
            self.metrics,
            lambda: self._scopes,
            self._release,
            self._take_cancel,
            affinity=cfg.prefix_affinity,
        )
        self._origin = Origin(self._nc, self.s, self.id, self.metrics, self.scheduler, self._release)
        self._held = Holdings(self.scheduler, self._origin, self._admitting)
        self._consumed = Consumed(
            self._nc,
            self.s,
            self.id,
            self.metrics,
            self.gate,
            self.live,
            self._dead,
            self._origin,
            self._admitting,
            self._take_cancel,
            self._release,
        )
        await self._origin.start()
        self._subs = [
            await self._nc.subscribe(self.s.worker_events, cb=self.live.on_heartbeat),
            await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel),
            # One replica handles each: a request that hit max_deliver goes to the DLQ once.
            await self._nc.subscribe(
                self._dead.advisory_subject, queue="laneway-brokers", cb=self._dead.on_max_deliveries
            ),
            # Every replica releases the quota grants it holds; metrics count each record once.
            await self._nc.subscribe(self.s.usage_all, cb=self._on_usage),
            await self._nc.subscribe(self.s.usage_all, queue="laneway-usage-metrics", cb=self._count_usage),
            await self._nc.subscribe(self.s.broker_events, cb=self._on_peer),
            await self._nc.subscribe(self.s.sched_leader, cb=self._on_leader),
        ]
        await self._nc.publish(self.s.worker_ping, b"")
        await self._nc.subscribe(self.s.worker_ping, cb=self._announce)
        await self._announce()
        kv, ttl_s = await open_lease_bucket(js, self.s, cfg.lease_ttl_s, cfg.limits.replicas)
        self._lease = Lease(kv, self.id, ttl_s, self._took_lease, self._lost_lease)
        await self._lease.step()  # free: a lone broker schedules from its first request
        await self._set_roles()
        sweep = Sweep(
            self._nc,
            self.scheduler.pools,
            self.live,
            self.metrics,
            self.gate,
            self._recent_cancels,
            self.scheduler.expire,
            self.scheduler.serve_parked,
            self._poke_intake,
            cfg.sweep_interval_s,
            cfg.limits.ack_wait_s / 3,
            self.s,
        )
        self._tasks = [
            asyncio.create_task(sweep.run(), name="laneway-sweep"),
            asyncio.create_task(sweep.probe_workers(), name="worker-probes"),
            asyncio.create_task(beat_forever(self._beat, BROKER_HEARTBEAT_S), name="broker-heartbeats"),
            asyncio.create_task(self._lease.run(), name="scheduler-lease"),
            asyncio.create_task(self._origin.resend_forever(), name="scheduler-resend"),
            asyncio.create_task(self._dead.run(), name="laneway-dead-letters"),
        ]
        log.info(
            "broker %s ready: scheduler=%s classes=%s pools=%s",
            self.id,
            self.scheduler.active,
            sorted(self.live.classes),
            sorted(self.live.pool_names()),
        )

    async def _start_gate(self, js) -> None:
        cfg = self.config
        self.gate.received = await Received.open(js, self.s, cfg.limits.replicas)
        if cfg.quotas:
            self.gate.quota = await Quota.open(js, self.s, cfg.limits.replicas)
            await self.gate.quota.start()
        if cfg.cache_ttl_s > 0:
            self.gate.cache = await ResponseCache.open(js, self.s, cfg.cache_ttl_s, replicas=cfg.limits.replicas)
        stage = await start_pii(cfg.pii, cfg.pii_workers, cfg.pii_max_chars)
        audit = lambda tenant, found: _started(self._nc).publish(self.s.audit(tenant), encode_audit(found))  # noqa: E731
        self.gate.use_pii(stage.gate, audit, stage.missing)

    async def stop(self) -> None:
        """Stop taking work. As the scheduler: answer parked pulls, hand this broker's own waiting
        requests back to JetStream (nak) and give up the lease, so a standby takes over at once.
        What other brokers admitted stays with them (they send it to the next scheduler)."""
        if self._nc is None:
            return  # never started, or stopped already
        async with self._roles:  # no role switch starts an intake from here on
            self._stopping = True
            intake, self._intake = self._intake, None
        if intake is not None:
            await intake.stop()
        if self._retiring:  # their drains run the gate: with the sweep still up
            await asyncio.wait(set(self._retiring))
        await self._admitting.wait_idle()  # what the intakes handed on goes through the gate
        await cancel_and_wait(*self._tasks)
        if self._nc.is_connected:  # peers stop counting on this broker to consume
            await self._nc.publish(self.s.broker_event(self.id), codec.encode(BrokerBeat(leaving=True)))
        if self._nc is not None and self._nc.is_connected and self.scheduler is not None:
            await self.scheduler.step_down()
            if self._lease is not None and await self._lease.give_up():  # None: start() failed first
                await self._nc.publish(self.s.sched_leader, b"")
        await self.live.stop()
        if self.gate.quota is not None:
            await self.gate.quota.close()  # unused leases go back to the other replicas
        if self.gate.pii is not None:
            await self.gate.pii.close()
        await disconnect(self._nc)
        self._nc = None

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- roles: the scheduler lease, and whether to consume --------------------------------
    async def _took_lease(self) -> None:
        # Its lease lapsed or was given up: the last scheduler is gone, however recent its beat
        # (counted alive, it would stop this broker consuming with nobody else to).
        if self._leader and self._leader != self.id:
            self.peers.forget(self._leader)
        await _started(self.scheduler).take_over()
        await _started(self._origin).hand_to_self()
        await self._set_roles()

    async def _lost_lease(self, why: str) -> None:
        await _started(self.scheduler).step_down()
        await self._set_roles()

    async def _set_roles(self) -> None:
        """Consume requests unless this broker is the scheduler and another broker is alive."""
        async with self._roles:
            gating = not (_started(self.scheduler).active and self.peers.alive(time.monotonic()) > 0)
            if gating == self.gating or self._stopping:
                return
            self.gating = gating
            if gating:
                self._intake = Intakes(
                    _started(self._nc),
                    self.s,
                    _started(self._consumed).on_request,
                    _started(self._held),
                    self.config.max_held,
                    self.live,
                )
                self._intake.follow()
            elif self._intake is not None:
                # Off this task (the lease's, a heartbeat's, a peer's callback): the intake's drain
                # runs the gate on what its last pull delivered, which must not delay a renewal.
                intake, self._intake = self._intake, None
                task = asyncio.create_task(intake.stop(), name="laneway-intake-stop")
                self._retiring.add(task)
                task.add_done_callback(self._retired)
            log.info("broker %s %s requests", self.id, "consumes" if gating else "no longer consumes")

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping a request intake failed", exc_info=task.exception())

    async def _beat(self) -> None:
        await self._announce()
        await self._set_roles()

    async def _on_peer(self, msg: Msg) -> None:
        peer = msg.subject.rsplit(".", 1)[-1]
        beat = codec.broker_beat(msg.data)
        if beat.leaving:
            self.peers.forget(peer)
        else:
            self.peers.saw(peer, time.monotonic())
        scheduler = _started(self.scheduler)
        if not scheduler.active:
            for pool, depth in beat.queue_depths.items():
                self.live.health.set_queue_depth(pool, depth)
        if scheduler.active and (self.gating or beat.leaving):
            await self._set_roles()

    async def _on_leader(self, msg: Msg) -> None:
        if not msg.data and not (lease := _started(self._lease)).held:
            lease.poke()  # given up: try to take it now
        if msg.data:
            self._leader = msg.data.decode(errors="replace")
        await _started(self._origin).on_leader(msg)

    # -- what live config changes ----------------------------------------------------------
    def _apply_classes(self) -> None:
        for pool in self.scheduler.pools.values() if self.scheduler is not None else ():
            pool.lanes.set_classes(self.live.classes.values())
        self._follow()

    def _follow(self) -> None:
        if self._intake is not None:
            self._intake.follow()

    def _catalogue_changed(self) -> None:
        self._follow()
        tenants = self.live.tenants
        self._scopes = CacheScope({t.name: t.cache_group for t in tenants if t.cache_group})
        if self.gate.cache is not None:
            self.gate.cache.scopes = self._scopes
        self.usage_metrics.set_known(tenants=[t.name for t in tenants], models=self.live.model_names())

    async def _announce(self, msg: Msg | None = None) -> None:
        """`lw.evt.broker.<id>`: edges count a broker as part of readiness; brokers count peers,
        and take the scheduler's queue depths for routing."""
        beat = BrokerBeat(pii=self.gate.pii_stage, ack_wait_s=self.config.limits.ack_wait_s)
        if self.scheduler is not None and self.scheduler.active:
            beat.queue_depths = {name: len(pool.lanes) for name, pool in self.scheduler.pools.items()}
        await _started(self._nc).publish(self.s.broker_event(self.id), codec.encode(beat))

    # -- intake ---------------------------------------------------------------------------
    def _poke_intake(self) -> None:
        if self._intake is not None:
            self._intake.poke()

    async def _release(self, tenant: str, request_id: str, tokens: int = 0) -> None:
        await self.gate.release(tenant, request_id, tokens)

    async def _on_usage(self, msg: Msg) -> None:
        try:
            usage = codec.decode_usage(msg.data)
        except codec.DecodeError:
            return
        if usage.ttft_s is not None and not usage.cached:
            # Routing's TTFT: waiting in the lanes plus the engine's first token, as every
            # broker sees every usage record (the gate's own time before it is left out).
            self.live.health.observe_ttft(usage.pool, usage.queued_s + usage.ttft_s)
        running_ended(_started(self.scheduler).pools, usage.tenant, usage.request_id)
        await self._release(usage.tenant, usage.request_id, usage.prompt_tokens + usage.completion_tokens)

    async def _count_usage(self, msg: Msg) -> None:
        try:
            self.usage_metrics.observe(codec.decode_usage(msg.data))
        except codec.DecodeError:
            pass

    # -- cancels ----------------------------------------------------------------------------
    def _take_cancel(self, tenant: str, request_id: str) -> bool:
        """Whether a cancel for this request came before it did (and forget it)."""
        return self._recent_cancels.pop((tenant, request_id), None) is not None

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            tenant, request_id = self.s.parse_cancel(msg.subject)
        except BadToken:
            return
        # The subject says whose request it is (its publisher may use only its own); the payload
        # is not read: a tenant could name another tenant there.
        if await _started(self.scheduler).cancel(tenant, request_id):
            return
        if await _started(self._origin).cancel(tenant, request_id):
            return
        # Not here (yet): remember it briefly in case its message is still on the way.
        self._recent_cancels[(tenant, request_id)] = time.monotonic()
        while len(self._recent_cancels) > 10_000:
            self._recent_cancels.popitem(last=False)
