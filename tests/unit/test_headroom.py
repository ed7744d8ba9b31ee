"""Headroom sized to the top class's bursts (broker/headroom.py): at a worker where chats lately
held four slots at once, a standard-class storm leaves five free, not its share's two of 32; the
rule reaches the lanes through the scheduler's pulls, and the balance's view of other workers."""

from __future__ import annotations

import time

from broker.balance import Balance
from broker.headroom import WINDOW_S, Bursts
from broker.lanes import Lanes
from broker.pools import ParkedPull
from broker.waiting import Item
from core.policy.classes import DEFAULT_CLASSES
from schemas.requests import GenerateRequest
from schemas.work import Admitted, Credit
from tests.requests import chat
from tests.unit.test_lanes import item
from tests.unit.test_parked_choice import Ack, scheduler

CLASSES = {c.name: c for c in DEFAULT_CLASSES}


def test_a_burst_is_remembered_for_the_window_then_forgotten():
    bursts = Bursts()
    assert bursts.reserve("w1", 0.0) == 0
    for now, held in [(0.0, 1), (1.0, 4), (2.0, 2), (3.0, 0)]:
        bursts.heard("w1", held, now)
    assert bursts.reserve("w1", 3.0) == 5  # the window's most, and room for one more
    assert bursts.reserve("w2", 3.0) == 0  # per worker
    assert bursts.reserve("w1", 1.0 + WINDOW_S + 0.1) == 3  # the 4 has left the window; the 2 has not
    assert bursts.reserve("w1", 3.0 + WINDOW_S + 0.1) == 0  # idle: nothing reserved


def take(lanes: Lanes, running: dict[str, int], reserve: int) -> list[Item]:
    return lanes.select(
        free_slots=32 - sum(running.values()),
        token_budget=10**9,
        total_slots=32,
        running=running,
        now=0.0,
        reserve=reserve,
    ).dispatch


def waiting(**classes: int) -> Lanes:
    lanes = Lanes(DEFAULT_CLASSES)
    for klass, n in classes.items():
        for _ in range(n):
            lanes.admit(item(klass=klass), 0.0)
    return lanes


def test_the_classes_below_the_top_leave_its_recent_burst_free():
    # Standard's share alone: 30 of 32 (0.95). A burst of 4 chats lately: 32 - 5 = 27.
    assert len(take(waiting(standard=8), {"standard": 24}, reserve=0)) == 6
    assert len(take(waiting(standard=8), {"standard": 24}, reserve=5)) == 3
    # The top class itself is never held back by its own bursts.
    assert len(take(waiting(interactive=3), {"standard": 27, "interactive": 2}, reserve=5)) == 3
    # Batch, below both, counts the top class's bursts only, not standard's: 27 - 20.
    assert len(take(waiting(batch=10), {"batch": 20}, reserve=5)) == 7
    assert len(take(waiting(batch=10), {"batch": 20}, reserve=0)) == 8  # its share: 28


def test_the_balance_reads_another_workers_room_with_its_bursts():
    """A worker whose chats' burst leaves a standard request no slot there is not one that could
    take it: the batch's worker is not held back for it."""
    other = Credit(
        worker_id="w2", pool="sim", free_slots=5, token_budget=10**9, total_slots=32, running={"standard": 27}
    )
    standard = item(klass="standard")
    by_share = Balance([other], 32)
    with_bursts = Balance([other], 32, cap=lambda policy, c: 27 if policy.name != "interactive" else 32)
    assert not by_share.allows(CLASSES["standard"], standard, held=32)
    assert with_bursts.allows(CLASSES["standard"], standard, held=32)


def admitted(n: int, klass: str) -> Admitted:
    now = time.time()
    request = GenerateRequest(
        request_id=f"r{n}",
        tenant="acme",
        klass=klass,
        model="laneway-sim",
        reply_to="_INBOX.x",
        created_at=now,
        deadline=now + 60,
        chat=chat(f"question {n}", max_tokens=16),
    )
    return Admitted(request, Ack(n).reply, 1, "sim", "b1")


def credit(running: dict[str, int]) -> Credit:
    return Credit(
        worker_id="w1",
        pool="sim",
        free_slots=32 - sum(running.values()),
        token_budget=10**9,
        total_slots=32,
        running=running,
    )


async def test_a_pull_that_shows_a_burst_of_chats_makes_the_storm_leave_room_for_it():
    s, nc = scheduler()
    pool = s.pool("sim")
    pool.heard(credit({"interactive": 4, "standard": 20}), time.monotonic())  # four chats at once
    storm = credit({"standard": 24})  # the chats ended; the storm's next pull
    pool.heard(storm, time.monotonic())
    for n in range(8):
        await s.enqueue(admitted(n, "standard"), Ack(n), 64)
    pool.parked.append(ParkedPull(storm, "reply.w1", time.monotonic() + 30))
    await s.serve_parked("sim", pool)
    dispatched = [d for batch in nc.batches("reply.w1") for d in batch]
    assert len(dispatched) == 3, len(dispatched)  # 27 = 32 less the burst and one; its share alone: 30
