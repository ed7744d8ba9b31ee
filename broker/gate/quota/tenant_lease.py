"""One tenant's lease, `TenantLease`: what this replica holds of the tenant's shared counters,
and the round trips that change it: refills of the minute's rate, the month's budget and the
concurrency slots, and giving back what an idle lease holds. `Quota` (leases.py) decides when."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.gate.quota.store import CounterStore, decode_budget, decode_rate, decode_slots
from core.policy.quota import (
    LimitName,
    QuotaExceeded,
    QuotaPolicy,
    RateState,
    Take,
    lease_chunk,
    minute_of,
    month_of,
    return_budget,
    return_rate,
    seconds_to_month_end,
    set_slots,
    take_budget,
    take_rate,
)


@dataclass(slots=True, eq=False)
class TenantLease:
    """What this replica holds for one tenant. Refills and give-backs hold `lock`; the hot path
    charges without it, synchronously (one event loop: no await between check and charge)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    policy: QuotaPolicy = field(default_factory=QuotaPolicy)
    window: int = -1
    requests: int = 0  # leased, not yet used, in `window` (< 0: a debt)
    tokens: int = 0
    left_requests: int = 0  # shared capacity left at the last refill: for the headers
    left_tokens: int = 0
    month: int = -1
    budget: int = 0
    slots_held: int = 0
    slots_used: int = 0
    slots_renewed: float = 0.0
    touched: float = 0.0  # monotonic
    refusal: QuotaExceeded | None = None  # the last refusal, trusted until `refused_until`
    refused_until: float = 0.0
    refused_at: float = 0.0


def states(lease: TenantLease, now: float) -> tuple[RateState | None, RateState | None]:
    p = lease.policy
    reset = (lease.window + 1) * 60 - now
    requests = (
        RateState(p.requests_per_min, lease.left_requests + max(0, lease.requests), reset)
        if p.requests_per_min is not None
        else None
    )
    tokens = (
        RateState(p.tokens_per_min, lease.left_tokens + max(0, lease.tokens), reset)
        if p.tokens_per_min is not None
        else None
    )
    return requests, tokens


def refusal(
    tenant: str, lease: TenantLease, name: LimitName, limit: int, remaining: int, reset: float, message: str, now: float
) -> QuotaExceeded:
    requests, tokens = states(lease, now)
    return QuotaExceeded(tenant, name, limit, remaining, reset, message, requests=requests, tokens=tokens)


async def refill_rate(
    store: CounterStore,
    tenant: str,
    lease: TenantLease,
    policy: QuotaPolicy,
    window: int,
    need_r: int,
    need_t: int,
    *,
    fraction: float,
    clock: Callable[[], float],
) -> None:
    rpm, tpm = policy.requests_per_min, policy.tokens_per_min
    want_r = max(need_r, lease_chunk(rpm, fraction) - lease.requests) if rpm else 0
    want_t = max(need_t, lease_chunk(tpm, fraction) - lease.tokens) if tpm else 0
    take = await store.cas(
        f"{tenant}.rate", decode_rate, lambda doc: take_rate(doc, window, policy, need_r, need_t, want_r, want_t)
    )
    if take.period > lease.window:  # another replica's clock already opened the next window
        lease.window, lease.requests, lease.tokens = take.period, 0, 0
    lease.requests += take.got_requests
    lease.tokens += take.got_tokens
    lease.left_requests, lease.left_tokens = take.left_requests, take.left_tokens
    if take.denied is None:
        return
    now = clock()
    reset = (take.period + 1) * 60 - now
    if take.denied is LimitName.requests:
        assert rpm is not None, "take_rate refuses only a limit the policy sets"
        raise refusal(
            tenant,
            lease,
            LimitName.requests,
            rpm,
            take.left_requests + lease.requests,
            reset,
            f"rate limit reached: {rpm} requests per minute",
            now,
        )
    assert tpm is not None, "take_rate refuses only a limit the policy sets"
    remaining = take.left_tokens + lease.tokens
    message = (
        f"this request needs ~{need_t + lease.tokens} tokens, more than the limit of {tpm} "
        "tokens per minute; lower max_tokens"
        if need_t + lease.tokens > tpm
        else f"rate limit reached: {tpm} tokens per minute ({max(0, remaining)} left)"
    )
    raise refusal(tenant, lease, LimitName.tokens, tpm, remaining, reset, message, now)


async def refill_budget(
    store: CounterStore,
    tenant: str,
    lease: TenantLease,
    budget: int,
    month: int,
    need: int,
    *,
    fraction: float,
    clock: Callable[[], float],
) -> None:
    want = max(need, lease_chunk(budget, fraction) - lease.budget)
    take = await store.cas(f"{tenant}.budget", decode_budget, lambda doc: take_budget(doc, month, budget, need, want))
    if take.period > lease.month:
        lease.month, lease.budget = take.period, 0
    lease.budget += take.got_tokens
    if take.denied is not None:
        now = clock()
        left = max(0, take.left_tokens + lease.budget)
        raise refusal(
            tenant,
            lease,
            LimitName.budget,
            budget,
            left,
            seconds_to_month_end(now),
            f"monthly token budget exhausted: {left} of {budget} tokens left, this "
            f"request needs ~{need + lease.budget}",
            now,
        )


def hold_only_in_use(lease: TenantLease) -> int:
    """Before a slots write: hold locally only the slots in use, and return that count. The
    write records `in_use + spare` for this replica, where the store may grant less spare
    than asked (other replicas took it); a slot charged on the lock-free hot path while
    the write is on its way would then be one the store counts for nobody. Admissions wait
    on the lease's lock instead, and the hold is set from the store's answer."""
    lease.slots_held = min(lease.slots_held, lease.slots_used)
    return lease.slots_used


async def grow_slots(
    store: CounterStore,
    tenant: str,
    lease: TenantLease,
    limit: int,
    now: float,
    *,
    replica_id: str,
    slot_ttl: float,
    fraction: float,
) -> None:
    in_use = hold_only_in_use(lease)
    take = await store.cas(
        f"{tenant}.slots",
        decode_slots,
        lambda doc: set_slots(doc, replica_id, now, slot_ttl, limit, in_use, lease_chunk(limit, fraction), 1),
    )
    if take.denied is not None:
        # No reset time is knowable for concurrency: a slot frees when some request ends.
        raise refusal(
            tenant,
            lease,
            LimitName.concurrency,
            limit,
            0,
            1.0,
            f"too many concurrent requests: the limit is {limit}",
            now,
        )
    lease.slots_held, lease.slots_renewed = in_use + take.got_requests, now


async def resize_slots(
    store: CounterStore,
    tenant: str,
    lease: TenantLease,
    spare: int,
    *,
    replica_id: str,
    slot_ttl: float,
    clock: Callable[[], float],
) -> None:
    now, in_use = clock(), hold_only_in_use(lease)
    limit = lease.policy.max_concurrent or in_use + spare
    take = await store.cas(
        f"{tenant}.slots", decode_slots, lambda doc: set_slots(doc, replica_id, now, slot_ttl, limit, in_use, spare, 0)
    )
    lease.slots_held, lease.slots_renewed = in_use + take.got_requests, now


async def settle(
    store: CounterStore,
    tenant: str,
    lease: TenantLease,
    now: float,
    idle: bool,
    *,
    replica_id: str,
    slot_ttl: float,
    clock: Callable[[], float],
) -> None:
    if lease.slots_held > 0 and (
        now - lease.slots_renewed >= slot_ttl / 3 or (idle and lease.slots_held > lease.slots_used)
    ):
        await resize_slots(
            store,
            tenant,
            lease,
            0 if idle else lease.slots_held - lease.slots_used,
            replica_id=replica_id,
            slot_ttl=slot_ttl,
            clock=clock,
        )
    if not idle:
        return
    # Each lease leaves the local books BEFORE the await: the lock-free hot path must not
    # spend what is on its way back (it is put back if the write fails).
    if lease.requests or lease.tokens:
        window, requests, tokens = lease.window, lease.requests, lease.tokens
        lease.requests = lease.tokens = 0
        if window >= minute_of(now):
            try:
                await store.cas(
                    f"{tenant}.rate", decode_rate, lambda doc: Take(return_rate(doc, window, requests, tokens))
                )
            except BaseException:
                if lease.window == window:
                    lease.requests, lease.tokens = lease.requests + requests, lease.tokens + tokens
                raise
    if lease.budget:
        month, budget = lease.month, lease.budget
        lease.budget = 0
        if month >= month_of(now):
            try:
                await store.cas(f"{tenant}.budget", decode_budget, lambda doc: Take(return_budget(doc, month, budget)))
            except BaseException:
                if lease.month == month:
                    lease.budget += budget
                raise
