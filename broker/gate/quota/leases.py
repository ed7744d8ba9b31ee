"""The quota stage itself, `Quota`: this replica's leases of the shared counters, how it
admits from them, refills them and gives them back (the design: this package's doc)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from broker.gate.quota.store import (
    CounterStore,
    QuotaContended,
    QuotaUnavailable,
    decode_budget,
    decode_rate,
    decode_slots,
    ensure_quota_bucket,
)
from core.policy.quota import (
    LimitName,
    QuotaExceeded,
    QuotaGrant,
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
from core.tasks import cancel_and_wait
from schemas.subjects import Subjects

log = logging.getLogger("laneway.quota")

_ERROR_ORDER = (LimitName.budget, LimitName.tokens, LimitName.requests, LimitName.concurrency)


@dataclass(slots=True, eq=False)
class _Lease:
    """What this replica holds for one tenant. Refills and give-backs hold `lock`; the hot path
    charges without it, synchronously (one event loop: no await between check and charge)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    policy: QuotaPolicy = field(default_factory=QuotaPolicy)
    window: int = -1
    requests: int = 0           # leased, not yet used, in `window` (< 0: a debt)
    tokens: int = 0
    left_requests: int = 0      # shared capacity left at the last refill: for the headers
    left_tokens: int = 0
    month: int = -1
    budget: int = 0
    slots_held: int = 0
    slots_used: int = 0
    slots_renewed: float = 0.0
    touched: float = 0.0        # monotonic
    refusal: QuotaExceeded | None = None    # the last refusal, trusted until `refused_until`
    refused_until: float = 0.0
    refused_at: float = 0.0


class Quota:
    def __init__(self, kv: KeyValue, *, replica_id: str | None = None, lease_fraction: float = 0.1,
                 budget_lease_fraction: float = 0.001, slot_ttl_s: float = 30.0,
                 idle_settle_s: float = 2.0, tick_s: float = 0.5, refusal_ttl_s: float = 0.5,
                 fail_open: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = CounterStore(kv)
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.admitted = self.refused = 0
        self._fraction = lease_fraction
        self._budget_fraction = budget_lease_fraction
        self._slot_ttl = slot_ttl_s
        self._idle = idle_settle_s
        self._tick = tick_s
        self._refusal_ttl = refusal_ttl_s
        self._fail_open = fail_open
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0      # after a store failure, fail open without waiting until then

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1, **options: Any) -> Quota:
        return cls(await ensure_quota_bucket(js, s, replicas), **options)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._maintain(), name="quota-maintain")

    async def close(self) -> None:
        """Give every unused lease back, so the other replicas can use it at once."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait(task)      # logs how the task failed, if it had
        for tenant, lease in list(self._leases.items()):
            async with lease.lock:
                try:
                    await self._settle(tenant, lease, self._clock(), idle=True)
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("could not return %s's quota leases: %s", tenant, exc)

    async def __aenter__(self) -> Quota:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- admission ------------------------------------------------------------------------
    async def admit(self, tenant: str, policy: QuotaPolicy, estimated_tokens: int, *,
                    force: bool = False) -> QuotaGrant:
        """Charge one request; raises `QuotaExceeded` naming the limit it is over. `force`
        charges without refusing: for a redelivered request, which was accepted long ago."""
        est = max(0, estimated_tokens)
        if policy.unlimited:
            return QuotaGrant(tenant, est, -1, -1, False)
        lease = self._leases.get(tenant)
        if lease is None:
            lease = self._leases[tenant] = _Lease()
        lease.policy = policy
        lease.touched = time.monotonic()
        now = self._clock()
        if not any(self._needs(lease, policy, est, now)):
            # The hot path: the local lease covers it. No await between check and charge, so
            # no other task can spend the same lease; and no lock, so no convoy behind a refill.
            return self._charge(tenant, lease, policy, est, now)
        if self._fail_open and now < self._down_until:
            return self._charge(tenant, lease, policy, est, now)   # store down: unmetered, no wait
        async with lease.lock:
            while True:
                now = self._clock()
                need_r, need_t, need_b, need_s = self._needs(lease, policy, est, now)  # a refill may have landed
                if not (need_r or need_t or need_b or need_s):
                    break
                if not force:
                    self._refuse_again(lease, now, need_r, need_t, need_b, need_s)
                jobs = []
                if need_r > 0 or need_t > 0:
                    jobs.append(self._refill_rate(tenant, lease, policy, lease.window, need_r, need_t))
                # _needs asks only for what the policy limits: the `is not None`s are always true
                if need_b > 0 and policy.monthly_tokens is not None:
                    jobs.append(self._refill_budget(tenant, lease, policy.monthly_tokens, lease.month, need_b))
                if need_s and policy.max_concurrent is not None:
                    jobs.append(self._grow_slots(tenant, lease, policy.max_concurrent, now))
                await self._await_refills(tenant, lease, jobs, now, force)
                # The refills ran as tasks, which finish a loop turn before this resumes: an
                # admission on the lock-free hot path may have spent what they brought. Look
                # again (a refill the store refuses raises), unless this charge is a debt anyway
                # (forced) or the store is down and the tenant's policy fails open.
                if force or (self._fail_open and self._clock() < self._down_until):
                    break
            return self._charge(tenant, lease, policy, est, now)

    @staticmethod
    def _needs(lease: _Lease, policy: QuotaPolicy, est: int, now: float) -> tuple[int, int, int, bool]:
        """What the local lease lacks for one request of `est` tokens (periods rolled first)."""
        window, month = minute_of(now), month_of(now)
        if window > lease.window:
            lease.window, lease.requests, lease.tokens, lease.refusal = window, 0, 0, None
        if month > lease.month:
            lease.month, lease.budget, lease.refusal = month, 0, None
        return (1 - lease.requests if policy.requests_per_min is not None and lease.requests < 1 else 0,
                est - lease.tokens if policy.tokens_per_min is not None and lease.tokens < est else 0,
                est - lease.budget if policy.monthly_tokens is not None and lease.budget < est else 0,
                policy.max_concurrent is not None and lease.slots_used >= lease.slots_held)

    def _charge(self, tenant: str, lease: _Lease, policy: QuotaPolicy, est: int, now: float) -> QuotaGrant:
        rate_tokens, budget, slot = (policy.tokens_per_min is not None, policy.monthly_tokens is not None,
                                     policy.max_concurrent is not None)
        lease.requests -= 1 if policy.requests_per_min is not None else 0
        lease.tokens -= est if rate_tokens else 0
        lease.budget -= est if budget else 0
        lease.slots_used += 1 if slot else 0
        self.admitted += 1
        return QuotaGrant(tenant, est, lease.window if rate_tokens else -1, lease.month if budget else -1,
                          slot, *self._states(lease, now))

    def _refuse_again(self, lease: _Lease, now: float, need_r: int, need_t: int, need_b: int,
                      need_s: bool) -> None:
        """Refuse from the last fresh refusal while it is young, when this request needs what
        it said was gone: a tenant hammering past its limit costs no KV round trip per request.
        Capacity freed elsewhere is seen `refusal_ttl_s` later at most (a tenth of it for a slot)."""
        last = lease.refusal
        if last is None or now >= lease.refused_until:
            return
        name = last.limit_name
        if ((name is LimitName.requests and need_r > 0)
                or (name is LimitName.tokens and need_t > last.remaining - max(0, lease.tokens))
                or (name is LimitName.budget and need_b > last.remaining - max(0, lease.budget))
                or (name is LimitName.concurrency and need_s)):
            self.refused += 1
            raise QuotaExceeded(last.tenant, name, last.limit, last.remaining,
                                last.reset_s - (now - lease.refused_at),
                                last.message, requests=last.requests, tokens=last.tokens)

    async def _await_refills(self, tenant: str, lease: _Lease, jobs: list, now: float, force: bool) -> None:
        results = await asyncio.gather(*jobs, return_exceptions=True)
        refusals = {r.limit_name: r for r in results if isinstance(r, QuotaExceeded)}
        for name in _ERROR_ORDER if not force else ():     # forced: over the limit, as a debt
            if name in refusals:
                self.refused += 1
                # A slot freed on another replica must not sit idle long: trust those briefly.
                ttl = self._refusal_ttl / 10 if name is LimitName.concurrency else self._refusal_ttl
                lease.refusal, lease.refused_until, lease.refused_at = refusals[name], now + ttl, now
                raise refusals[name]
        failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, QuotaExceeded)]
        for failure in failures:
            if not isinstance(failure, (QuotaUnavailable, nats.errors.Error, TimeoutError)):
                raise failure   # cancelled, or a bug: not the store being unreachable
        if failures:
            contended = next((f for f in failures if isinstance(f, QuotaContended)), None)
            if contended is not None and not force:
                raise contended         # the store is up: a limit under contention still holds
            if not self._fail_open:
                raise QuotaUnavailable(str(failures[0])) from failures[0]
            # Admitted unmetered: the local lease goes negative and the next refill pays it back.
            # For a second, admissions skip the store instead of each waiting for its timeout.
            self._down_until = now + 1.0
            log.warning("quota store unavailable for %s, admitting: %s", tenant, failures[0])

    def _states(self, lease: _Lease, now: float) -> tuple[RateState | None, RateState | None]:
        p = lease.policy
        reset = (lease.window + 1) * 60 - now
        requests = (RateState(p.requests_per_min, lease.left_requests + max(0, lease.requests), reset)
                    if p.requests_per_min is not None else None)
        tokens = (RateState(p.tokens_per_min, lease.left_tokens + max(0, lease.tokens), reset)
                  if p.tokens_per_min is not None else None)
        return requests, tokens

    def _refusal(self, tenant: str, lease: _Lease, name: LimitName, limit: int, remaining: int,
                 reset: float, message: str, now: float) -> QuotaExceeded:
        requests, tokens = self._states(lease, now)
        return QuotaExceeded(tenant, name, limit, remaining, reset, message, requests=requests, tokens=tokens)

    async def _refill_rate(self, tenant: str, lease: _Lease, policy: QuotaPolicy, window: int,
                           need_r: int, need_t: int) -> None:
        rpm, tpm = policy.requests_per_min, policy.tokens_per_min
        want_r = max(need_r, lease_chunk(rpm, self._fraction) - lease.requests) if rpm else 0
        want_t = max(need_t, lease_chunk(tpm, self._fraction) - lease.tokens) if tpm else 0
        take = await self.store.cas(f"{tenant}.rate", decode_rate,
                               lambda doc: take_rate(doc, window, policy, need_r, need_t, want_r, want_t))
        if take.period > lease.window:     # another replica's clock already opened the next window
            lease.window, lease.requests, lease.tokens = take.period, 0, 0
        lease.requests += take.got_requests
        lease.tokens += take.got_tokens
        lease.left_requests, lease.left_tokens = take.left_requests, take.left_tokens
        if take.denied is None:
            return
        now = self._clock()
        reset = (take.period + 1) * 60 - now
        if take.denied is LimitName.requests:
            assert rpm is not None, "take_rate refuses only a limit the policy sets"
            raise self._refusal(tenant, lease, LimitName.requests, rpm, take.left_requests + lease.requests,
                                reset, f"rate limit reached: {rpm} requests per minute", now)
        assert tpm is not None, "take_rate refuses only a limit the policy sets"
        remaining = take.left_tokens + lease.tokens
        message = (f"this request needs ~{need_t + lease.tokens} tokens, more than the limit of {tpm} "
                   "tokens per minute; lower max_tokens" if need_t + lease.tokens > tpm else
                   f"rate limit reached: {tpm} tokens per minute ({max(0, remaining)} left)")
        raise self._refusal(tenant, lease, LimitName.tokens, tpm, remaining, reset, message, now)

    async def _refill_budget(self, tenant: str, lease: _Lease, budget: int, month: int, need: int) -> None:
        want = max(need, lease_chunk(budget, self._budget_fraction) - lease.budget)
        take = await self.store.cas(f"{tenant}.budget", decode_budget,
                               lambda doc: take_budget(doc, month, budget, need, want))
        if take.period > lease.month:
            lease.month, lease.budget = take.period, 0
        lease.budget += take.got_tokens
        if take.denied is not None:
            now = self._clock()
            left = max(0, take.left_tokens + lease.budget)
            raise self._refusal(tenant, lease, LimitName.budget, budget, left, seconds_to_month_end(now),
                                f"monthly token budget exhausted: {left} of {budget} tokens left, this "
                                f"request needs ~{need + lease.budget}", now)

    @staticmethod
    def _hold_only_in_use(lease: _Lease) -> int:
        """Before a slots write: hold locally only the slots in use, and return that count. The
        write records `in_use + spare` for this replica, where the store may grant less spare
        than asked (other replicas took it); a slot charged on the lock-free hot path while
        the write is on its way would then be one the store counts for nobody. Admissions wait
        on the lease's lock instead, and the hold is set from the store's answer."""
        lease.slots_held = min(lease.slots_held, lease.slots_used)
        return lease.slots_used

    async def _grow_slots(self, tenant: str, lease: _Lease, limit: int, now: float) -> None:
        in_use = self._hold_only_in_use(lease)
        take = await self.store.cas(f"{tenant}.slots", decode_slots, lambda doc: set_slots(
            doc, self.replica_id, now, self._slot_ttl, limit, in_use, lease_chunk(limit, self._fraction), 1))
        if take.denied is not None:
            # No reset time is knowable for concurrency: a slot frees when some request ends.
            raise self._refusal(tenant, lease, LimitName.concurrency, limit, 0, 1.0,
                                f"too many concurrent requests: the limit is {limit}", now)
        lease.slots_held, lease.slots_renewed = in_use + take.got_requests, now

    # -- release --------------------------------------------------------------------------
    async def release(self, grant: QuotaGrant, actual_tokens: int) -> None:
        """The request finished: its slot comes back and the token estimate is corrected."""
        if grant.released:
            return
        grant.released = True
        lease = self._leases.get(grant.tenant)
        if lease is None:
            return
        refund = grant.tokens - max(0, actual_tokens)       # < 0: used more than estimated
        if grant.window >= 0 and grant.window == lease.window:
            lease.tokens += refund
        if grant.month >= 0 and grant.month == lease.month:
            lease.budget += refund
        lease.touched = time.monotonic()
        lease.refusal = None            # capacity came back here: look again
        if not grant.slot:
            return
        lease.slots_used = max(0, lease.slots_used - 1)
        conc = lease.policy.max_concurrent
        slack = lease_chunk(conc, self._fraction) - 1 if conc else 0
        if lease.slots_held - lease.slots_used > slack:
            async with lease.lock:      # hand back the spare slots another replica may be waiting for
                try:
                    await self._resize_slots(grant.tenant, lease, slack)
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("could not return %s's slots (they expire): %s", grant.tenant, exc)

    async def _resize_slots(self, tenant: str, lease: _Lease, spare: int) -> None:
        now, in_use = self._clock(), self._hold_only_in_use(lease)
        limit = lease.policy.max_concurrent or in_use + spare
        take = await self.store.cas(f"{tenant}.slots", decode_slots, lambda doc: set_slots(
            doc, self.replica_id, now, self._slot_ttl, limit, in_use, spare, 0))
        lease.slots_held, lease.slots_renewed = in_use + take.got_requests, now

    # -- background: renew slots, give back idle leases -----------------------------------
    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            now, mono = self._clock(), time.monotonic()
            for tenant, lease in list(self._leases.items()):
                if lease.lock.locked():
                    continue
                idle = mono - lease.touched >= self._idle
                try:
                    async with lease.lock:
                        await self._settle(tenant, lease, now, idle)
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("quota upkeep for %s failed: %s", tenant, exc)
                if idle and lease.slots_held == 0 and mono - lease.touched > 600:
                    self._leases.pop(tenant, None)      # memory stays bounded by active tenants

    async def _settle(self, tenant: str, lease: _Lease, now: float, idle: bool) -> None:
        if lease.slots_held > 0 and (now - lease.slots_renewed >= self._slot_ttl / 3
                                     or (idle and lease.slots_held > lease.slots_used)):
            await self._resize_slots(tenant, lease, 0 if idle else lease.slots_held - lease.slots_used)
        if not idle:
            return
        # Each lease leaves the local books BEFORE the await: the lock-free hot path must not
        # spend what is on its way back (it is put back if the write fails).
        if lease.requests or lease.tokens:
            window, requests, tokens = lease.window, lease.requests, lease.tokens
            lease.requests = lease.tokens = 0
            if window >= minute_of(now):
                try:
                    await self.store.cas(f"{tenant}.rate", decode_rate,
                                         lambda doc: Take(return_rate(doc, window, requests, tokens)))
                except BaseException:
                    if lease.window == window:
                        lease.requests, lease.tokens = lease.requests + requests, lease.tokens + tokens
                    raise
        if lease.budget:
            month, budget = lease.month, lease.budget
            lease.budget = 0
            if month >= month_of(now):
                try:
                    await self.store.cas(f"{tenant}.budget", decode_budget,
                                         lambda doc: Take(return_budget(doc, month, budget)))
                except BaseException:
                    if lease.month == month:
                        lease.budget += budget
                    raise
