"""The scheduler side: the lanes of every pool and the worker pulls parked on them. Only the
broker holding the lease runs it (`take_over` … `step_down`).

Requests come in two ways: the broker's own gate (`enqueue`, no NATS hop) or another broker's
(`Admitted` on `lw.sched.admit`, answered taken / refused). Each leaves the lanes once, and its
origin hears of it (`Settled`) BEFORE a worker's `Batch` carries it: a scheduler dying between
the two leaves the origin without a copy, and the request comes back by JetStream redelivery
after ack_wait, never as a second generation.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.balance import load
from broker.lanes import Lanes
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics
from broker.pools import Acks, Held, ParkedPull, Pool
from broker.room import engine_priorities
from broker.scheduler.answers import ADMIT_ERRORS, AckHandle, refuse
from broker.scheduler.preference import best_parked, placed, preference, request_prefix
from broker.waiting import Admit, Item
from core.acks import same_message
from core.cache import CacheScope, prefix_salt
from core.tracing import tracer
from schemas import codec
from schemas.errors import ErrorCode
from schemas.subjects import Subjects
from schemas.work import AdmitAnswer, Admitted, Batch, Credit, Dispatch, Settled, Settlement

log = logging.getLogger("laneway.scheduler")

# A Dispatch's fields around its request, and the Batch around them, stay well under this.
DISPATCH_OVERHEAD_BYTES = 256
MAX_PULL_HOLD_S = 30.0
REMEMBER_SETTLED = 100_000  # requests that left the lanes, remembered against late copies

_TAKEN, _REFUSED = codec.encode(AdmitAnswer(True)), codec.encode(AdmitAnswer(False))


class Scheduler:
    def __init__(
        self,
        nc: Client,
        s: Subjects,
        broker_id: str,
        max_deliver: int,
        live: LiveConfig,
        metrics: BrokerMetrics,
        scopes: Callable[[], CacheScope],
        release: Callable[[str, str], Awaitable[None]],
        cancelled: Callable[[str, str], bool] = lambda tenant, request_id: False,
        affinity: bool = True,
    ) -> None:
        self._nc = nc
        self.s = s
        self.id = broker_id
        self._max_deliver = max_deliver
        self.live = live
        self.metrics = metrics
        self._scopes = scopes
        self._release = release  # this broker's own quota grants
        self._cancelled = cancelled  # a cancel that came before its request (consumed)
        self.affinity = affinity  # prefer the worker that holds a prompt's prefix
        self.pools: dict[str, Pool] = {}  # the sweep holds this very dict: cleared, never replaced
        self.active = False
        self._subs: list = []
        # (tenant, request id) → (ack subject, release) of requests that left the lanes: a copy
        # its origin sent again before it heard (the same delivery) is settled again, never run
        # twice. A new delivery of the message (JetStream redelivered it) runs: at least once.
        self._settled: OrderedDict[tuple[str, str], tuple[str, bool]] = OrderedDict()
        self._tracing = tracer()

    # -- the lease ------------------------------------------------------------------------
    async def take_over(self) -> None:
        """Answer pulls and admissions from now on, then say so: origins send what they hold,
        workers pull afresh (a pull parked at a dead scheduler would wait out its timeout)."""
        self.active = True
        self.metrics.scheduler.set(1)
        self.metrics.takeovers.inc()
        # A queue group: a scheduler that has not yet noticed its lapse shares rather than doubles.
        self._subs = [
            await self._nc.subscribe(self.s.pull_all, queue="laneway-scheduler", cb=self._on_pull),
            await self._nc.subscribe(self.s.sched_admit, queue="laneway-scheduler", cb=self._on_admitted),
        ]
        await self._nc.publish(self.s.sched_leader, self.id.encode())
        log.info("scheduler %s took over", self.id)

    async def step_down(self) -> None:
        """Empty batches for parked pulls; this broker's own admissions go back to JetStream (nak)
        for another gate; the rest are dropped: their origins send them to the next scheduler."""
        if not self.active:
            return
        self.active = False
        self.metrics.scheduler.set(0)
        subs, self._subs = self._subs, []
        try:
            for sub in subs:
                await sub.unsubscribe()
            for pool in self.pools.values():
                # Emptied first: a sweep tick still holding this pool finds nothing to hand out.
                parked, pool.parked = pool.parked, []
                items = pool.lanes.waiting_items()
                for item in items:
                    pool.lanes.forget(item.tenant, item.request_id)
                for p in parked:
                    await self._nc.publish(p.reply, codec.encode(Batch()))
                for item in items:
                    held: Held = item.payload
                    if held.origin == self.id:
                        await held.ack.nak()
                        await self._release(item.tenant, item.request_id)
        except nats.errors.Error as exc:  # disconnected: what was not naked returns after ack_wait
            log.warning("stepping down: could not hand every request back: %r", exc)
        for name in self.pools:
            self.metrics.parked_pulls.labels(name).set(0)
        self.pools.clear()

    # -- admissions -------------------------------------------------------------------------
    def pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = Pool(Lanes(self.live.classes.values(), self.live.tenants.weight))
        return pool

    def __len__(self) -> int:
        return sum(len(p.lanes) for p in self.pools.values())

    async def _on_admitted(self, msg: Msg) -> None:
        try:
            admitted = codec.decode_admitted(msg.data)
        except codec.DecodeError:
            log.warning("ignored a malformed admission (%d bytes)", len(msg.data))
            return
        # Touched at 0: its last in-progress ack may be a dead scheduler's, so the next sweep
        # sends one rather than a full interval from now.
        taken = await self.enqueue(
            admitted, AckHandle(self._nc, admitted.ack_subject), len(msg.data) + DISPATCH_OVERHEAD_BYTES, touched=0.0
        )
        if msg.reply:
            await self._nc.publish(msg.reply, _TAKEN if taken else _REFUSED)

    async def enqueue(self, admitted: Admitted, ack: Acks, size: int, touched: float | None = None) -> bool:
        """Into the lanes (False: refused, the client told; the origin gives back its grant)."""
        request = admitted.request
        tenant, klass = request.tenant, request.klass
        key = (tenant, request.request_id)
        gone = self._settled.get(key)
        if gone is not None and admitted.ack_subject == gone[0]:
            await self._tell(admitted.origin, [Settlement(tenant, request.request_id, gone[1])])
            return True
        if self._cancelled(tenant, request.request_id):
            # The client's cancel came before its admission: it never runs.
            self.metrics.cancelled.labels(klass).inc()
            await ack.term()
            self._remember(key, admitted.ack_subject, release=True)
            return False
        pool = self.pool(admitted.pool)
        existing = pool.lanes.get(tenant, request.request_id)
        if existing is not None:
            held = existing.payload
            if not (request.escalated or same_message(held.ack.reply, admitted.ack_subject)):
                # Another message under an id that waits here: merged, it would skip its charge
                # and orphan the original. Refused, the original waits on untouched.
                await refuse(
                    self._nc,
                    self.metrics,
                    ack,
                    request,
                    admitted.attempt,
                    ErrorCode.duplicate_request,
                    f"request_id {request.request_id!r} is already queued",
                    "request_id",
                )
                return False
            # Redelivered while still waiting here, or sent again by its origin: keep one entry,
            # with the newest ack subject.
            held.ack, held.attempt, held.origin = ack, admitted.attempt, admitted.origin
            return True
        now = time.time()
        held = Held(
            ack,
            request,
            admitted.attempt,
            admitted.pool,
            time.monotonic() if touched is None else touched,
            admitted.cache_key,
            admitted.cache_model,
            admitted.escalate_to,
            admitted.headers,
            admitted.origin,
            admitted.output_pii,
            admitted.adapter,
        )
        item = Item(
            request.request_id,
            tenant,
            klass,
            request.estimated_cost(),
            request.deadline,
            now,
            payload=held,
            size=size,
            slots=request.choices,
            prompt=request.estimated_prompt_tokens(),
            prefix=request_prefix(request, prefix_salt(self._scopes().scope(tenant)), admitted.adapter)
            if self.affinity
            else (),
            adapter=request.model if admitted.adapter else "",
            redelivered=admitted.attempt > 1,
        )
        verdict = pool.lanes.admit(item, now)
        if verdict is not Admit.OK:
            code, text = ADMIT_ERRORS[verdict]
            if verdict is Admit.EXPIRED:
                self.metrics.expired.labels(klass).inc()
            await refuse(self._nc, self.metrics, ack, request, admitted.attempt, code, text)
            # A copy sent again (its answer came late) is settled again, never admitted after all.
            self._remember(key, admitted.ack_subject, release=True)
            return False
        await self.serve_parked(admitted.pool, pool)
        return True

    # -- pulls ----------------------------------------------------------------------------
    async def _on_pull(self, msg: Msg) -> None:
        try:
            credit = codec.decode_credit(msg.data)
        except codec.DecodeError:
            log.warning("ignored a malformed pull on %s", msg.subject)
            return
        if not msg.reply:
            return
        pool = self.pool(credit.pool)
        pool.heard(credit, mono := time.monotonic())
        pool.loads.pulled(credit.worker_id)
        if (fence := pool.running.fence_again(credit.worker_id, time.time())) is not None:
            await self._nc.publish(self.s.fence(credit.worker_id), codec.encode(fence))  # it is back
        # A worker's fresh credit supersedes its parked one (its room changed meanwhile).
        superseded = [p for p in pool.parked if p.credit.worker_id == credit.worker_id]
        if superseded:
            pool.parked = [p for p in pool.parked if p.credit.worker_id != credit.worker_id]
            for old in superseded:
                await self._nc.publish(old.reply, codec.encode(Batch()))
        if await self._answer(pool, credit, msg.reply):
            # What the balance left of it may go to a parked pull now (its worker less loaded).
            await self.serve_parked(credit.pool, pool)
            return
        until = mono + max(0.0, min(credit.wait_s, MAX_PULL_HOLD_S))
        pool.parked.append(ParkedPull(credit, msg.reply, until))
        self.metrics.parked_pulls.labels(credit.pool).set(len(pool.parked))

    async def _answer(self, pool: Pool, credit: Credit, reply: str) -> bool:
        """Reply to a pull if there is work for it; False leaves it for the caller to park."""
        now, mono = time.time(), time.monotonic()
        balance = pool.loads.balance(credit, (p.credit for p in pool.parked), mono, self.live.rank, pool.cap(mono))
        selection = pool.lanes.select(
            free_slots=credit.free_slots,
            token_budget=credit.token_budget,
            total_slots=credit.total_slots,
            running=credit.running,
            classes=credit.classes,
            now=now,
            max_bytes=self._nc.max_payload - DISPATCH_OVERHEAD_BYTES,
            step_tokens=credit.step_tokens,
            prefill=credit.prefill,
            kv_tokens=credit.kv_tokens,
            tenant_slots=credit.tenant_slots,
            tenant_tokens=credit.tenant_tokens,
            tenant_prefill=credit.tenant_prefill,
            prefer=preference(pool, credit) if self.affinity else None,
            balanced=balance.allows,
            reserve=pool.bursts.reserve(credit.worker_id, mono),
        )
        for item in selection.expired:
            await self.expire(item)
        if not selection.dispatch:
            return False
        dispatches = []
        priorities = engine_priorities(selection.dispatch, credit.tenant_slots, self.live.rank)
        for item, priority in zip(selection.dispatch, priorities, strict=True):
            held: Held = item.payload
            queued = now - item.enqueued_at
            dispatches.append(
                Dispatch(
                    held.request,
                    held.ack.reply,
                    held.attempt,
                    priority=priority,
                    queued_s=queued,
                    max_deliver=self._max_deliver,
                    cache_key=held.cache_key,
                    cache_model=held.cache_model,
                    cache_salt=prefix_salt(self._scopes().scope(item.tenant)),
                    headers=held.headers,
                    output_pii=held.output_pii,
                    adapter=held.adapter,
                    **held.cascade(self.live.rules),
                )
            )
            self.metrics.queue_wait.labels(item.klass).observe(queued)
            self._tracing.record(
                "laneway.broker.queue",
                held.request.traceparent,
                item.enqueued_at,
                now,
                request_id=item.request_id,
                tenant=item.tenant,
                pool=credit.pool,
                worker=credit.worker_id,
                queued_s=queued,
            )
            self.metrics.dispatched.labels(credit.pool, item.klass).inc()
        self.metrics.batch_size.labels(credit.pool).observe(len(dispatches))
        await self._settle(selection.dispatch, release=False)  # before the Batch: see the top
        await self._nc.publish(reply, codec.encode(Batch(dispatches)))
        pool.loads.sent(credit, selection.dispatch, mono)  # bookkeeping, after the work is out
        placed(pool, credit, selection.dispatch, self.metrics)
        pool.running.placed(credit.worker_id, selection.dispatch)  # handed back if that worker is lost
        return True

    async def serve_parked(self, name: str, pool: Pool) -> None:
        while self.active and pool.parked and len(pool.lanes):
            # The affinity choice, the longest parked, the least loaded (the balance never holds it
            # back): the choice weighs where the head is cached, not whether it fits (room, caps).
            tries = [
                pool.parked[best_parked(pool) if self.affinity else 0],
                pool.parked[0],
                min(pool.parked, key=lambda p: load(p.credit)),
            ]
            tries = [p for i, p in enumerate(tries) if p not in tries[:i]]
            for parked in tries:
                if parked not in pool.parked:  # superseded while we awaited
                    continue
                at = pool.parked.index(parked)
                del pool.parked[at]
                if await self._answer(pool, parked.credit, parked.reply):
                    break
                pool.parked.insert(min(at, len(pool.parked)), parked)
            else:
                break
        self.metrics.parked_pulls.labels(name).set(len(pool.parked))

    # -- leaving the lanes otherwise ----------------------------------------------------------
    async def cancel(self, tenant: str, request_id: str) -> bool:
        for pool in self.pools.values():
            item = pool.lanes.cancel(tenant, request_id)
            if item is not None:
                self.metrics.cancelled.labels(item.klass).inc()
                await item.payload.ack.term()
                await self._settle([item], release=True)
                return True
        return False

    async def expire(self, item: Item) -> None:
        held: Held = item.payload
        self.metrics.expired.labels(item.klass).inc()
        await refuse(
            self._nc,
            self.metrics,
            held.ack,
            held.request,
            held.attempt,
            ErrorCode.deadline_exceeded,
            "the request's deadline passed before it could start",
        )
        await self._settle([item], release=True)

    async def _settle(self, items: Iterable[Item], release: bool) -> None:
        """Tell each origin its requests left the lanes; this broker's own grants it gives back here."""
        by_origin: dict[str, list[Settlement]] = {}
        for item in items:
            origin = item.payload.origin
            self._remember(item.key, item.payload.ack.reply, release)
            if origin == self.id:
                if release:
                    await self._release(item.tenant, item.request_id)
            else:
                by_origin.setdefault(origin, []).append(Settlement(item.tenant, item.request_id, release))
        for origin, settled in by_origin.items():
            await self._tell(origin, settled)

    def _remember(self, key: tuple[str, str], ack_subject: str, release: bool) -> None:
        self._settled[key] = (ack_subject, release)
        if len(self._settled) > REMEMBER_SETTLED:
            self._settled.popitem(last=False)

    async def _tell(self, origin: str, settled: list[Settlement]) -> None:
        if origin != self.id:
            await self._nc.publish(self.s.sched_settled(origin), codec.encode(Settled(settled)))
