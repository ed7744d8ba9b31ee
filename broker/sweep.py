"""The broker's periodic upkeep: every `sweep_interval_s`, for each pool, refuse what expired
while waiting, keep waiting requests from being redelivered, answer pulls whose hold is up and
serve parked ones; then refresh the gauges, give back quota grants long past their deadline and
forget old cancels.

One job a function, each with its own error handling: a publish that fails (the connection is
down; the client reconnects by itself) stops that job for this tick, never the other jobs, the
other pools or the loop. The next tick retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client

from broker.gate.pipeline import Gate
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics
from broker.pools import Held, Pool
from broker.running import fence
from broker.scheduler.answers import AckHandle
from broker.waiting import Item
from broker.worker_probes import GONE_S as WORKER_GONE_S
from broker.worker_probes import probe_workers
from core.liveness import Silence
from core.tasks import wait_event
from schemas import codec
from schemas.subjects import Subjects
from schemas.work import Batch

log = logging.getLogger("laneway.sweep")

CANCEL_MEMORY_S = 60.0  # how long a cancel that came before its request is remembered


async def expire_waiting(pool: Pool, now: float, expire: Callable[[Item], Awaitable[None]]) -> None:
    """Refuse the requests whose deadline passed while they waited (they left the lanes)."""
    failed: list[str] = []
    for item in pool.lanes.expire(now):
        try:
            await expire(item)
        except nats.errors.Error as exc:  # its message comes back after ack_wait, still expired
            failed.append(f"{item.request_id} ({exc!r})")
    if failed:
        log.warning("could not refuse %d expired request(s): %s", len(failed), ", ".join(failed[:5]))


async def touch_waiting(pool: Pool, mono: float, every_s: float) -> None:
    """In-progress acks, so JetStream does not redeliver the requests that wait here."""
    for item in pool.lanes.waiting_items():
        held: Held = item.payload
        if mono - held.last_touch >= every_s:
            held.last_touch = mono
            await held.ack.in_progress()


async def answer_due_pulls(nc: Client, pool: Pool, mono: float) -> None:
    """An empty batch for each pull whose hold time is up, before the worker's request times out
    (its load still counts in the balance while its fresh pull comes)."""
    due = [p for p in pool.parked if p.until <= mono]
    for parked in due:
        await nc.publish(parked.reply, codec.encode(Batch()))
        pool.loads.sent(parked.credit, [], mono)
    if due:
        pool.parked = [p for p in pool.parked if p.until > mono]


async def hand_back_lost(
    nc: Client, s: Subjects, pool: Pool, lost: Callable[[str], str | None], metrics: BrokerMetrics
) -> None:
    """`-NAK` the requests running on workers that are `lost` (broker/running.py): JetStream
    delivers them again now, and each stream goes on on another worker (bridge/streams/continuation.py).
    Their pulls parked here are answered empty first, so none of it goes back to them. `lost`
    says by which signal a worker was found gone (`interest`, `silence`), None if it was not."""
    pool.running.expire(time.time())
    # A dead worker's parked pull must take no more work (it would be lost again): answered empty.
    dead_pulls = [p for p in pool.parked if lost(p.credit.worker_id)]
    if dead_pulls:
        pool.parked = [p for p in pool.parked if p not in dead_pulls]
        for parked in dead_pulls:
            await nc.publish(parked.reply, codec.encode(Batch()))
    pool.loads.drop_lost(lost)  # before the handed-back requests come to the lanes again
    for worker in pool.running.workers():
        if signal := lost(worker):
            gone = pool.running.lost(worker)
            log.warning(
                "worker %s lost (%s) with %d request(s) running: handed back for another worker",
                worker,
                "its NATS connection is gone" if signal == "interest" else "silent past its bound",
                len(gone),
            )
            metrics.workers_lost.labels(signal).inc()
            # The fence first: a worker that was only silent drops them before another takes them.
            await nc.publish(s.fence(worker), codec.encode(fence(gone)))
            for g in gone:
                await AckHandle(nc, g.ack_subject).nak()
            metrics.lost_handed_back.inc(len(gone))


def running_ended(pools: dict[str, Pool], tenant: str, request_id: str) -> None:
    """Its usage record came: no longer running anywhere."""
    for pool in pools.values():
        pool.running.ended((tenant, request_id))


def set_depth(metrics: BrokerMetrics, live: LiveConfig, name: str, pool: Pool) -> None:
    for klass, tenants in pool.lanes.depths().items():
        metrics.queue_depth.labels(name, klass).set(sum(tenants.values()))
    live.health.set_queue_depth(name, len(pool.lanes))


def set_tenant_depths(metrics: BrokerMetrics, pools: dict[str, Pool]) -> None:
    """Waiting requests by (pool, class, tenant): `laneway top`'s waiting column."""
    metrics.tenant_queue_depth.set(
        {
            (name, klass, tenant): n
            for name, pool in pools.items()
            for klass, tenants in pool.lanes.depths().items()
            for tenant, n in tenants.items()
        }
    )


def set_ready_workers(metrics: BrokerMetrics, live: LiveConfig) -> None:
    for name, h in live.refresh_health().items():
        metrics.ready_workers.labels(name).set(h.ready_workers)


def forget_cancels(recent: OrderedDict[tuple[str, str], float], before: float) -> None:
    """`recent` maps (tenant, request id) → monotonic time, oldest first."""
    while recent and next(iter(recent.values())) < before:
        recent.popitem(last=False)


@dataclass
class Sweep:
    """The loop that runs the jobs above; the broker builds it once connected."""

    nc: Client
    pools: dict[str, Pool]
    live: LiveConfig
    metrics: BrokerMetrics
    gate: Gate
    recent_cancels: OrderedDict[tuple[str, str], float]
    expire: Callable[[Item], Awaitable[None]]  # refuse one expired request
    serve_parked: Callable[[str, Pool], Awaitable[None]]
    after: Callable[[], None]  # each tick, once the jobs are done
    interval_s: float
    touch_every_s: float
    s: Subjects
    # The workers' interest, as broker/worker_probes.py hears it.
    probes: Silence = field(default_factory=lambda: Silence(WORKER_GONE_S))
    last_tick: float | None = field(default=None, init=False)
    wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)  # a worker found gone

    async def run(self) -> None:
        while True:
            await wait_event(self.wake, self.interval_s)
            self.wake.clear()
            try:
                await self.once(time.time(), time.monotonic())
            except Exception:
                # A bug, not a dropped connection (each job handles that): log it, keep sweeping,
                # or waiting requests stop being touched and all come back after ack_wait.
                log.exception("sweep failed")
            self.after()

    async def probe_workers(self) -> None:
        """Forever: probe the workers that run what this scheduler dispatched, and those whose
        pull waits here (so that each is found alive before its first dispatch)."""

        def workers() -> set[str]:
            running = {w for pool in self.pools.values() for w in pool.running.workers()}
            return running | {p.credit.worker_id for pool in self.pools.values() for p in pool.parked}

        await probe_workers(self.nc, self.s, workers, self.probes, self.metrics, self.wake.set)

    async def once(self, now: float, mono: float) -> None:
        # This loop's own lateness is slack: a beat it has not read yet is not a missing one.
        late = 0.0 if self.last_tick is None else max(0.0, mono - self.last_tick - self.interval_s)
        self.last_tick = mono
        health = self.live.health

        def lost(worker: str) -> str | None:
            if self.probes.gone(worker, mono):
                return "interest"
            return "silence" if health.gone(worker, late) else None

        for name, pool in list(self.pools.items()):  # a pull may add a pool meanwhile
            await self._publishing(
                "handing back a lost worker's requests",
                hand_back_lost(self.nc, self.s, pool, lost, self.metrics),
            )
            await expire_waiting(pool, now, self.expire)
            await self._publishing("in-progress acks", touch_waiting(pool, mono, self.touch_every_s))
            await self._publishing("answering due pulls", answer_due_pulls(self.nc, pool, mono))
            await self._publishing("serving parked pulls", self.serve_parked(name, pool))
            set_depth(self.metrics, self.live, name, pool)
        set_tenant_depths(self.metrics, self.pools)
        set_ready_workers(self.metrics, self.live)
        await self.gate.release_expired(now)
        forget_cancels(self.recent_cancels, mono - CANCEL_MEMORY_S)

    @staticmethod
    async def _publishing(job: str, work: Awaitable[None]) -> None:
        try:
            await work
        except nats.errors.Error as exc:
            log.warning("sweep: %s failed: %r", job, exc)
