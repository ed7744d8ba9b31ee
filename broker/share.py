"""Each tenant's bounded share of something many tenants use at once. Pure asyncio: no clock.

A tenant holds at most `limit` units at once; its other callers wait in order of their class
(`rank`, 0 first: a tenant's chat is never queued behind its own batch flood), in arrival order
within a rank, and a wait of one tenant never holds up another's. The PII stage counts one unit per job in its analyzer
pool (one process busy): a tenant flooding the gate with large prompts keeps at most `limit`
processes busy, and another tenant's job queues behind at most the jobs already there, never
behind the flood. The broker counts one unit per request under admission (`broker/admitting.py`).

    units = await share.take(tenant, want, rank)   # 1..want units, by rank then FIFO; cancellable
    ...                                      # one unit per job handed to the pool
    share.give_back(tenant)                  # as each job ends: its process is free again

Invariant, per tenant: held <= limit, and while any caller of the tenant waits, held == limit (a
unit given back passes straight to the first waiter, which then holds it).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


def default_share(processes: int) -> int:
    """Half the pool, rounded up: with two or more processes one tenant never holds them all,
    and two tenants flooding at once fill it without a third waiting behind either flood."""
    return max(1, (processes + 1) // 2)


class TenantShare:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a tenant's share is at least one job, not {limit}")
        self.limit = limit
        self._held: dict[str, int] = {}
        # Per tenant, a heap of (rank, arrival, waiter): the first live one is served next.
        self._waiting: dict[str, list[tuple[int, int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()

    def held(self, tenant: str) -> int:
        """Units the tenant holds, those handed to a waiter that has not resumed yet included."""
        return self._held.get(tenant, 0)

    def waiting(self, tenant: str) -> int:
        return sum(not w.done() for _, _, w in self._waiting.get(tenant, ()))

    async def take(self, tenant: str, want: int = 1, rank: int = 0) -> int:
        """Wait for one unit (behind the tenant's callers of a lower rank number, and its earlier
        ones of the same rank), then take as many more as are free, up to `want` while none of
        the tenant's callers waits: how many the caller now holds.

        Cancelled while it waits, a caller has taken nothing and gives back nothing; cancelled
        after a unit was handed to it but before it resumed, it passes that unit on."""
        held = self._held.get(tenant, 0)
        if held < self.limit and not self._waiting.get(tenant):
            self._held[tenant] = held + 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting.setdefault(tenant, []), (rank, next(self._arrivals), waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.give_back(tenant)  # it was handed over: pass it on
                else:
                    self._forget(tenant, waiter)
                raise
        more = 0 if self._waiting.get(tenant) else min(want - 1, self.limit - self._held[tenant])
        if more > 0:
            self._held[tenant] += more
        return 1 + max(0, more)

    def give_back(self, tenant: str, units: int = 1) -> None:
        """`units` jobs of the tenant ended: each unit goes to its first live waiter, if any."""
        for _ in range(units):
            if self._hand_over(tenant):
                continue  # the unit stays held, now for the waiter
            held = self._held.get(tenant, 0)
            if held <= 0:
                raise RuntimeError(f"tenant {tenant!r} gave back a unit of the PII pool it did not hold")
            if held == 1:
                del self._held[tenant]
            else:
                self._held[tenant] = held - 1

    def _hand_over(self, tenant: str) -> bool:
        """Wake the tenant's first live waiter, if it has one."""
        queue = self._waiting.get(tenant)
        if queue is None:
            return False
        while queue and queue[0][2].done():  # cancelled, its task not yet resumed
            heapq.heappop(queue)
        woken = bool(queue)
        if woken:
            heapq.heappop(queue)[2].set_result(None)
        if not queue:
            del self._waiting[tenant]
        return woken

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        kept = [entry for entry in queue if entry[2] is not waiter]
        if len(kept) != len(queue):  # else give_back already dropped it
            heapq.heapify(kept)
            queue[:] = kept
        if not queue:
            del self._waiting[tenant]
