"""The balance (broker/affinity.py: not more than BALANCE above the least loaded worker, or
BALANCE_FLOOR of its slots) held while one pull's batch is made, not only when a parked pull is
chosen. No I/O.

A burst that finds no pull parked (each worker's fresh pull on its way after its last batch)
waits in the lanes, and the first worker to pull again had room for all of it: 60 streams sent
together went 49 to one worker and 11 to the other. So a batch counts its own placements against
the pool's other workers that could take work now: those whose pull is parked, by their credit,
and those just sent a batch, by their credit less that batch, until their fresh pull comes (or
RETURN_S: full, or gone). An item that would take its worker past the balance above the least
loaded of those with room for it (its class's slots too) is left for them.

Whatever keeps the less loaded from taking it (its prefill, its tenants' headroom, a pull that
never comes), the balance holds work back at most HOLD_S without a batch going out in the pool;
then a batch is made as if alone, and work goes where it can, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec

from broker.affinity import balance_slack
from broker.room import Wants, class_cap, held_from, unranked
from core.policy.classes import ClassPolicy
from schemas.work import Credit

RETURN_S = 5.0  # a worker sent a batch pulls again at once: not by then, it is full or gone
HOLD_S = 1.0  # the longest the balance holds work back while no batch goes out in the pool


def share_cap(policy: ClassPolicy, credit: Credit) -> int:
    """A class's slots at the credit's worker by its share alone: no bursts known."""
    return class_cap(policy, credit.total_slots)


def load(credit: Credit) -> int:
    """Sequences the worker holds (running and accepted)."""
    return sum(credit.running.values())


def could_take(credit: Credit, item: Wants) -> bool:
    """Whether a worker could take the item by its room alone (class caps are the lanes' to judge)."""
    return (
        (not credit.classes or item.klass in credit.classes)
        and item.slots <= credit.free_slots
        and (item.cost <= credit.token_budget or not any(credit.running.values()))
    )


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

    __slots__ = ("_others", "_slots", "_holds", "_rank", "_cap")

    def __init__(
        self,
        others: Sequence[Credit],
        slots: int,
        holds: Callable[[], None] = lambda: None,
        rank: Callable[[str], int | None] = unranked,
        cap: Callable[[ClassPolicy, Credit], int] = share_cap,
    ) -> None:
        self._others = others
        self._slots = slots  # the batch's worker's: the floor is a part of them
        self._holds = holds  # told when it leaves an item for another worker
        self._rank = rank  # the classes' ranks: a class's share counts those after it (broker/room.py)
        self._cap = cap  # a class's slots at a worker (its share, its top class's bursts)

    def allows(self, policy: ClassPolicy, item: Wants, held: int) -> bool:
        """Whether the item may join a batch whose worker holds `held` sequences with it so far.
        The least loaded takes it however many sequences it needs."""
        least = min(
            (
                load(c)
                for c in self._others
                if could_take(c, item) and held_from(c.running, policy, self._rank) + item.slots <= self._cap(policy, c)
            ),
            default=None,
        )
        if least is None or held <= least or held + item.slots <= least + balance_slack(least, self._slots):
            return True
        self._holds()
        return False


class Loads:
    """The pool's workers just sent a batch, each by its credit less the batch, until its fresh
    pull comes (`pulled`) or RETURN_S passes; and since when the balance holds work back."""

    def __init__(self) -> None:
        self._out: dict[str, tuple[Credit, float]] = {}
        self._holding: float | None = None  # when a batch first held work back since one went out

    def pulled(self, worker: str) -> None:
        self._out.pop(worker, None)

    def drop_lost(self, lost: Callable[[str], object]) -> None:
        """Workers found `lost` take nothing more, so none holds a batch back: a dead worker's
        credit would keep its sequences' worth of work from the survivor that must take it."""
        self._out = {w: out for w, out in self._out.items() if not lost(w)}

    def sent(self, credit: Credit, items: Sequence[Wants], now: float) -> None:
        """A batch (or an empty answer) went to the credit's worker."""
        self._out[credit.worker_id] = (after(credit, items), now)
        if items:
            self._holding = None

    def balance(
        self,
        credit: Credit,
        parked: Iterable[Credit],
        now: float,
        rank: Callable[[str], int | None],
        cap: Callable[[ClassPolicy, Credit], int] = share_cap,
    ) -> Balance:
        """The balance for a batch answering `credit`, the pool's parked pulls' credits given."""
        self._out = {w: out for w, out in self._out.items() if now - out[1] < RETURN_S}
        if self._holding is not None and now - self._holding >= HOLD_S:
            return Balance((), credit.total_slots)
        others = [c for c in (*parked, *(c for c, _ in self._out.values())) if c.worker_id != credit.worker_id]
        return Balance(others, credit.total_slots, lambda: self._hold(now), rank, cap)

    def _hold(self, now: float) -> None:
        if self._holding is None:
            self._holding = now
