"""The balance held while one pull's batch is made (broker/balance.py): what counts of the pool's
other workers, how far a batch may fill its worker against them, and how long it holds work back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import msgspec

from broker.affinity import balance_slack
from broker.balance import HOLD_S, RETURN_S, Balance, Loads, after, load
from broker.lanes import Lanes
from broker.pools import Pool
from broker.sweep import hand_back_lost
from core.policy.classes import DEFAULT_CLASSES
from schemas.subjects import Subjects
from schemas.work import Credit

SLOTS = 64  # a floor of 4 sequences (BALANCE_FLOOR of 64)
CLASS = next(c for c in DEFAULT_CLASSES if c.name == "interactive")
RANK = {c.name: c.rank for c in DEFAULT_CLASSES}.get


@dataclass
class Want:
    klass: str = "interactive"
    slots: int = 1
    cost: int = 100
    tenant: str = "acme"
    prompt: int = 10


def credit(worker: str, held: int = 0, classes: tuple[str, ...] = (), budget: int = 100_000) -> Credit:
    return Credit(
        worker_id=worker,
        pool="sim",
        free_slots=SLOTS - held,
        token_budget=budget,
        total_slots=SLOTS,
        classes=list(classes),
        running={"interactive": held} if held else {},
    )


def test_a_batch_fills_its_worker_up_to_the_balance_above_the_least_loaded():
    balance = Balance([credit("w2", held=10), credit("w3", held=30)], SLOTS)
    ceiling = int(10 + balance_slack(10, SLOTS))
    assert balance.allows(CLASS, Want(), ceiling - 1)
    assert not balance.allows(CLASS, Want(), ceiling)
    assert not balance.allows(CLASS, Want(slots=2), ceiling - 1)
    # The least loaded takes an item however many sequences it needs.
    assert balance.allows(CLASS, Want(slots=SLOTS), 10)
    assert Balance([], SLOTS).allows(CLASS, Want(), 1_000)  # alone in its pool


def test_only_a_worker_with_room_for_the_item_holds_a_batch_back():
    full = credit("w2", held=SLOTS)
    other_class = credit("w3", held=0, classes=("batch",))
    no_kv = credit("w4", held=1, budget=10)
    balance = Balance([full, other_class, no_kv], SLOTS)
    assert balance.allows(CLASS, Want(), 40)
    assert not balance.allows(CLASS, Want(klass="batch"), 40)
    assert not balance.allows(CLASS, Want(cost=5), 40)
    # Nor one whose share of the item's class is full (the class's slots at that worker).
    capped = msgspec.structs.replace(CLASS, max_slot_share=2 / SLOTS)
    assert Balance([credit("w5", held=2)], SLOTS).allows(capped, Want(), 40)
    assert not Balance([credit("w5", held=1)], SLOTS).allows(capped, Want(), 40)
    # Nor one where the item's class and those after it fill the class's share (here half of 64):
    # the lanes would not give it the item there, so it holds nothing back.
    standard = msgspec.structs.replace(next(c for c in DEFAULT_CLASSES if c.name == "standard"), max_slot_share=0.5)
    floods = msgspec.structs.replace(credit("w6"), free_slots=32, running={"batch": 29, "standard": 3})
    assert Balance([floods], SLOTS, rank=RANK).allows(standard, Want(klass="standard"), 40)
    below = msgspec.structs.replace(floods, running={"batch": 28, "standard": 3})
    assert not Balance([below], SLOTS, rank=RANK).allows(standard, Want(klass="standard"), 40)


def test_a_worker_just_sent_a_batch_counts_with_it_until_its_fresh_pull_or_return_s():
    loads = Loads()
    mine, sent = credit("w1"), credit("w2")
    loads.sent(sent, [Want()] * 3, now=100.0)
    assert load(after(sent, [Want()] * 3)) == 3
    assert not loads.balance(mine, [], now=100.1, rank=RANK).allows(CLASS, Want(), 3 + int(balance_slack(3, SLOTS)))
    assert loads.balance(mine, [], now=100.0 + RETURN_S, rank=RANK).allows(CLASS, Want(), 40)  # full, or gone
    loads.sent(sent, [Want()] * 3, now=200.0)
    loads.pulled("w2")  # its fresh credit is parked now, or answered
    assert loads.balance(mine, [], now=200.1, rank=RANK).allows(CLASS, Want(), 40)
    assert not loads.balance(mine, [credit("w2", held=3)], now=200.1, rank=RANK).allows(CLASS, Want(), 40)
    assert loads.balance(mine, [credit("w1", held=3)], now=200.1, rank=RANK).allows(CLASS, Want(), 40)  # itself


def test_work_is_held_back_at_most_hold_s_while_no_batch_goes_out():
    loads = Loads()
    mine, parked = credit("w1"), [credit("w2", held=0)]
    assert not loads.balance(mine, parked, now=10.0, rank=RANK).allows(CLASS, Want(), 40)
    assert not loads.balance(mine, parked, now=10.0 + HOLD_S / 2, rank=RANK).allows(CLASS, Want(), 40)
    assert loads.balance(mine, parked, now=10.0 + HOLD_S, rank=RANK).allows(CLASS, Want(), 40)
    # A batch going out in the pool starts the count again.
    loads.sent(credit("w3"), [Want()], now=20.0)
    assert not loads.balance(mine, parked, now=20.0 + HOLD_S, rank=RANK).allows(CLASS, Want(), 40)


def test_a_worker_found_lost_holds_no_batch_back_from_the_survivor():
    """A worker SIGKILLed as its pull came due: answered empty, its credit counted in the balance
    for RETURN_S. Found lost, it must not hold back the requests handed back for the survivor,
    HOLD_S per batch (loadtest.failover at 2 workers: stall p50 3.4 s → 2.5 s without it)."""
    pool = Pool(lanes=Lanes(DEFAULT_CLASSES))
    mine, mono = credit("w1", held=50), time.monotonic()
    pool.loads.sent(credit("w2", held=50), [], mono)
    assert not pool.loads.balance(mine, [], mono, RANK).allows(CLASS, Want(), 80)

    asyncio.run(hand_back_lost(None, Subjects(), pool, lambda w: "interest" if w == "w2" else None, None))  # type: ignore[arg-type]
    assert pool.loads.balance(mine, [], mono, RANK).allows(CLASS, Want(), 80)
