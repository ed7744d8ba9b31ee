"""The balance (broker/affinity.py: not more than BALANCE above the least loaded worker, or
BALANCE_FLOOR of its slots) held while one pull's batch is made, not only when a parked pull is
chosen. No I/O.

A burst that finds no pull parked (every worker's fresh pull is on its way after its last batch)
waits in the lanes, and the first worker to pull again had room for all of it: 60 streams sent
together went 49 to one worker and 11 to the other. So a batch counts its own placements against
the pool's other workers that can take work now: those whose pull is parked, by their credit,
and those just sent a batch, by their credit less that batch, until their fresh pull comes. An
item that would take its worker past the balance above the least loaded of those that could take
it is left for them.

What is known of a worker counts for RETURN_S after it was heard or sent work. One sent a batch
that does not pull again within it is full (a worker pulls while it has a free slot) or gone; one
whose pull waits here longer while work waits is kept from it by the caps (its class's slots, its
prefill, its tenants' headroom). Either way its load says no longer where work should go, and the
work goes where it can, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from broker.affinity import balance_slack
from broker.room import Wants
from schemas.work import Credit

# A worker sent a batch pulls again at once (one round trip, its batch handed to its engine).
RETURN_S = 1.0


def load(credit: Credit) -> int:
    """Sequences the worker holds (running and accepted)."""
    return sum(credit.running.values())


def could_take(credit: Credit, item: Wants) -> bool:
    """Whether a worker could take the item by its room alone (class caps are the lanes' to judge)."""
    return ((not credit.classes or item.klass in credit.classes) and item.slots <= credit.free_slots
            and (item.cost <= credit.token_budget or not any(credit.running.values())))


def after(credit: Credit, items: Iterable[Wants]) -> Credit:
    """The credit as a batch of `items` leaves its worker's room."""
    running = dict(credit.running)
    free, budget = credit.free_slots, credit.token_budget
    for item in items:
        running[item.klass] = running.get(item.klass, 0) + item.slots
        free, budget = free - item.slots, max(0, budget - item.cost)
    return msgspec.structs.replace(credit, running=running, free_slots=free, token_budget=budget)


class Balance:
    """One batch's limit: the loads of the pool's other workers that could take work now."""

    __slots__ = ("_others", "_slots")

    def __init__(self, others: Sequence[Credit], slots: int) -> None:
        self._others = others
        self._slots = slots             # the batch's worker's: the floor is a part of them

    def allows(self, item: Wants, held: int) -> bool:
        """Whether the item may join a batch whose worker holds `held` sequences with it so far.
        The least loaded takes it however many sequences it needs."""
        least = min((load(c) for c in self._others if could_take(c, item)), default=None)
        return least is None or held <= least or held + item.slots <= least + balance_slack(least, self._slots)


class Loads:
    """The pool's workers just sent a batch, each by its credit less the batch, until its fresh
    pull comes (`pulled`) or RETURN_S passes."""

    def __init__(self) -> None:
        self._out: dict[str, tuple[Credit, float]] = {}

    def pulled(self, worker: str) -> None:
        self._out.pop(worker, None)

    def sent(self, credit: Credit, items: Sequence[Wants], now: float) -> None:
        self._out[credit.worker_id] = (after(credit, items), now)

    def balance(self, credit: Credit, parked: Iterable[tuple[Credit, float]], now: float) -> Balance:
        """The balance for a batch answering `credit`, with the parked pulls (credit, when it came)."""
        self._out = {w: seen for w, seen in self._out.items() if now - seen[1] < RETURN_S}
        heard = [*parked, *self._out.values()]
        others = [c for c, at in heard if c.worker_id != credit.worker_id and now - at < RETURN_S]
        return Balance(others, credit.total_slots)
