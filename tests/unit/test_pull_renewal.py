"""An idle worker's pull is renewed while the scheduler still holds it, so the worker is never
without a parked pull: a request that came in the round trip after an expiry went to another
worker (tests/e2e/test_adapters.py met it: an adapter loaded on both workers)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from schemas import codec
from schemas.work import Batch, Credit
from tests.wait import eventually
from workers.config import WorkerConfig
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.metrics import WorkerMetrics
from workers.pulling import Puller


@dataclass
class Reply:
    data: bytes


class HoldingScheduler:
    """Holds every pull open as the broker does while it has no work, and answers a worker's
    parked pull empty when a fresh one from it arrives (broker/scheduler/schedule.py)."""

    def __init__(self) -> None:
        self.pulls: list[Credit] = []
        self.held: list[asyncio.Future[Reply]] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> Reply:
        self.pulls.append(codec.decode_credit(data))
        for old in self.held:
            if not old.done():
                old.set_result(Reply(codec.encode(Batch())))
        held = asyncio.get_running_loop().create_future()
        self.held.append(held)
        return await held

    def renewed_while_held(self) -> bool:
        """A second pull came, and the first was answered only because it came."""
        return len(self.pulls) >= 2 and all(h.done() for h in self.held[:-1])


async def test_an_idle_worker_renews_its_pull_before_the_scheduler_lets_it_go():
    scheduler = HoldingScheduler()
    puller = Puller(
        scheduler,  # type: ignore[arg-type]
        "lw.pull.sim",
        WorkerConfig(pool="sim", worker_id="w1", pull_wait_s=0.2),
        SimEngine(PROFILES["llama-8b-h100"]),  # type: ignore[arg-type]
        WorkerMetrics(),
        {},
        lambda batch: None,
        asyncio.Event(),
        asyncio.Event(),
    )
    running = asyncio.create_task(puller.run())
    try:
        # Without the renewal the worker waits on its pull until the scheduler answers it: here, never.
        assert await eventually(scheduler.renewed_while_held, timeout=10)
        assert all(p.worker_id == "w1" and p.wait_s == 0.2 for p in scheduler.pulls)
    finally:
        running.cancel()
        for held in scheduler.held:
            held.cancel()  # the pulls left out end with the worker
        await asyncio.gather(running, *puller._late, return_exceptions=True)
