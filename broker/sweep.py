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
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client

from broker.gate.pipeline import Gate
from broker.lanes import Item
from broker.live import LiveConfig
from broker.metrics import BrokerMetrics
from broker.pools import Held, Pool
from schemas import codec
from schemas.work import Batch

log = logging.getLogger("laneway.sweep")

CANCEL_MEMORY_S = 60.0      # how long a cancel that came before its request is remembered


async def expire_waiting(pool: Pool, now: float, expire: Callable[[Item], Awaitable[None]]) -> None:
    """Refuse the requests whose deadline passed while they waited (they left the lanes)."""
    failed: list[str] = []
    for item in pool.lanes.expire(now):
        try:
            await expire(item)
        except nats.errors.Error as exc:   # its message comes back after ack_wait, still expired
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


def set_depth(metrics: BrokerMetrics, live: LiveConfig, name: str, pool: Pool) -> None:
    for klass, tenants in pool.lanes.depths().items():
        metrics.queue_depth.labels(name, klass).set(sum(tenants.values()))
    live.health.set_queue_depth(name, len(pool.lanes))


def set_tenant_depths(metrics: BrokerMetrics, pools: dict[str, Pool]) -> None:
    """Waiting requests by (pool, class, tenant): `laneway top`'s waiting column."""
    metrics.tenant_queue_depth.set({(name, klass, tenant): n for name, pool in pools.items()
                                    for klass, tenants in pool.lanes.depths().items() for tenant, n in tenants.items()})


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
    expire: Callable[[Item], Awaitable[None]]           # refuse one expired request
    serve_parked: Callable[[str, Pool], Awaitable[None]]
    after: Callable[[], None]                           # each tick, once the jobs are done
    interval_s: float
    touch_every_s: float

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.once(time.time(), time.monotonic())
            except Exception:
                # A bug, not a dropped connection (each job handles that): log it, keep sweeping,
                # or waiting requests stop being touched and all come back after ack_wait.
                log.exception("sweep failed")
            self.after()

    async def once(self, now: float, mono: float) -> None:
        for name, pool in list(self.pools.items()):   # a pull may add a pool meanwhile
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
