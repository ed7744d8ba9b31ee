"""The quota stage itself, `Quota`: this replica's leases of the shared counters, how it
admits from them, and when it refills them and gives them back (the round trips are
tenant_lease.py's; the design: this package's doc)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from broker.gate.quota.store import CounterStore, QuotaContended, QuotaUnavailable, ensure_quota_bucket
from broker.gate.quota.tenant_lease import (
    TenantLease,
    grow_slots,
    refill_budget,
    refill_rate,
    resize_slots,
    settle,
    states,
)
from core.policy.quota import (
    LimitName,
    QuotaExceeded,
    QuotaGrant,
    QuotaPolicy,
    lease_chunk,
    minute_of,
    month_of,
)
from core.tasks import cancel_and_wait, pause
from schemas.subjects import Subjects

log = logging.getLogger("laneway.quota")

_ERROR_ORDER = (LimitName.budget, LimitName.tokens, LimitName.requests, LimitName.concurrency)


class Quota:
    def __init__(
        self,
        kv: KeyValue,
        *,
        replica_id: str | None = None,
        lease_fraction: float = 0.1,
        budget_lease_fraction: float = 0.001,
        slot_ttl_s: float = 30.0,
        idle_settle_s: float = 2.0,
        tick_s: float = 0.5,
        refusal_ttl_s: float = 0.5,
        fail_open: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
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
        self._leases: dict[str, TenantLease] = {}
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0  # after a store failure, fail open without waiting until then

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1, **options: Any) -> Quota:
        return cls(await ensure_quota_bucket(js, s, replicas), **options)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._maintain(), name="quota-maintain")

    async def close(self) -> None:
        """Give every unused lease back, so the other replicas can use it at once."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait(task)  # logs how the task failed, if it had
        for tenant, lease in list(self._leases.items()):
            async with lease.lock:
                try:
                    await settle(
                        self.store,
                        tenant,
                        lease,
                        self._clock(),
                        idle=True,
                        replica_id=self.replica_id,
                        slot_ttl=self._slot_ttl,
                        clock=self._clock,
                    )
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("could not return %s's quota leases: %s", tenant, exc)

    async def __aenter__(self) -> Quota:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- admission ------------------------------------------------------------------------
    async def admit(
        self, tenant: str, policy: QuotaPolicy, estimated_tokens: int, *, force: bool = False
    ) -> QuotaGrant:
        """Charge one request; raises `QuotaExceeded` naming the limit it is over. `force`
        charges without refusing: for a redelivered request, which was accepted long ago."""
        est = max(0, estimated_tokens)
        if policy.unlimited:
            return QuotaGrant(tenant, est, -1, -1, False)
        lease = self._leases.get(tenant)
        if lease is None:
            lease = self._leases[tenant] = TenantLease()
        lease.policy = policy
        lease.touched = time.monotonic()
        now = self._clock()
        if not any(self._needs(lease, policy, est, now)):
            # The hot path: the local lease covers it. No await between check and charge, so
            # no other task can spend the same lease; and no lock, so no convoy behind a refill.
            return self._charge(tenant, lease, policy, est, now)
        if self._fail_open and now < self._down_until:
            return self._charge(tenant, lease, policy, est, now)  # store down: unmetered, no wait
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
                    jobs.append(
                        refill_rate(
                            self.store,
                            tenant,
                            lease,
                            policy,
                            lease.window,
                            need_r,
                            need_t,
                            fraction=self._fraction,
                            clock=self._clock,
                        )
                    )
                # _needs asks only for what the policy limits: the `is not None`s are always true
                if need_b > 0 and policy.monthly_tokens is not None:
                    jobs.append(
                        refill_budget(
                            self.store,
                            tenant,
                            lease,
                            policy.monthly_tokens,
                            lease.month,
                            need_b,
                            fraction=self._budget_fraction,
                            clock=self._clock,
                        )
                    )
                if need_s and policy.max_concurrent is not None:
                    jobs.append(
                        grow_slots(
                            self.store,
                            tenant,
                            lease,
                            policy.max_concurrent,
                            now,
                            replica_id=self.replica_id,
                            slot_ttl=self._slot_ttl,
                            fraction=self._fraction,
                        )
                    )
                await self._await_refills(tenant, lease, jobs, now, force)
                # The refills ran as tasks, which finish a loop turn before this resumes: an
                # admission on the lock-free hot path may have spent what they brought. Look
                # again (a refill the store refuses raises), unless this charge is a debt anyway
                # (forced) or the store is down and the tenant's policy fails open.
                if force or (self._fail_open and self._clock() < self._down_until):
                    break
            return self._charge(tenant, lease, policy, est, now)

    @staticmethod
    def _needs(lease: TenantLease, policy: QuotaPolicy, est: int, now: float) -> tuple[int, int, int, bool]:
        """What the local lease lacks for one request of `est` tokens (periods rolled first)."""
        window, month = minute_of(now), month_of(now)
        if window > lease.window:
            lease.window, lease.requests, lease.tokens, lease.refusal = window, 0, 0, None
        if month > lease.month:
            lease.month, lease.budget, lease.refusal = month, 0, None
        return (
            1 - lease.requests if policy.requests_per_min is not None and lease.requests < 1 else 0,
            est - lease.tokens if policy.tokens_per_min is not None and lease.tokens < est else 0,
            est - lease.budget if policy.monthly_tokens is not None and lease.budget < est else 0,
            policy.max_concurrent is not None and lease.slots_used >= lease.slots_held,
        )

    def _charge(self, tenant: str, lease: TenantLease, policy: QuotaPolicy, est: int, now: float) -> QuotaGrant:
        rate_tokens, budget, slot = (
            policy.tokens_per_min is not None,
            policy.monthly_tokens is not None,
            policy.max_concurrent is not None,
        )
        lease.requests -= 1 if policy.requests_per_min is not None else 0
        lease.tokens -= est if rate_tokens else 0
        lease.budget -= est if budget else 0
        lease.slots_used += 1 if slot else 0
        self.admitted += 1
        return QuotaGrant(
            tenant, est, lease.window if rate_tokens else -1, lease.month if budget else -1, slot, *states(lease, now)
        )

    def _refuse_again(
        self, lease: TenantLease, now: float, need_r: int, need_t: int, need_b: int, need_s: bool
    ) -> None:
        """Refuse from the last fresh refusal while it is young, when this request needs what
        it said was gone: a tenant hammering past its limit costs no KV round trip per request.
        Capacity freed elsewhere is seen `refusal_ttl_s` later at most (a tenth of it for a slot)."""
        last = lease.refusal
        if last is None or now >= lease.refused_until:
            return
        name = last.limit_name
        if (
            (name is LimitName.requests and need_r > 0)
            or (name is LimitName.tokens and need_t > last.remaining - max(0, lease.tokens))
            or (name is LimitName.budget and need_b > last.remaining - max(0, lease.budget))
            or (name is LimitName.concurrency and need_s)
        ):
            self.refused += 1
            raise QuotaExceeded(
                last.tenant,
                name,
                last.limit,
                last.remaining,
                last.reset_s - (now - lease.refused_at),
                last.message,
                requests=last.requests,
                tokens=last.tokens,
            )

    async def _await_refills(self, tenant: str, lease: TenantLease, jobs: list, now: float, force: bool) -> None:
        results = await asyncio.gather(*jobs, return_exceptions=True)
        refusals = {r.limit_name: r for r in results if isinstance(r, QuotaExceeded)}
        for name in _ERROR_ORDER if not force else ():  # forced: over the limit, as a debt
            if name in refusals:
                self.refused += 1
                # A slot freed on another replica must not sit idle long: trust those briefly.
                ttl = self._refusal_ttl / 10 if name is LimitName.concurrency else self._refusal_ttl
                lease.refusal, lease.refused_until, lease.refused_at = refusals[name], now + ttl, now
                raise refusals[name]
        failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, QuotaExceeded)]
        for failure in failures:
            if not isinstance(failure, (QuotaUnavailable, nats.errors.Error, TimeoutError)):
                raise failure  # cancelled, or a bug: not the store being unreachable
        if failures:
            contended = next((f for f in failures if isinstance(f, QuotaContended)), None)
            if contended is not None and not force:
                raise contended  # the store is up: a limit under contention still holds
            if not self._fail_open:
                raise QuotaUnavailable(str(failures[0])) from failures[0]
            # Admitted unmetered: the local lease goes negative and the next refill pays it back.
            # For a second, admissions skip the store instead of each waiting for its timeout.
            self._down_until = now + 1.0
            log.warning("quota store unavailable for %s, admitting: %s", tenant, failures[0])

    # -- release --------------------------------------------------------------------------
    async def release(self, grant: QuotaGrant, actual_tokens: int) -> None:
        """The request finished: its slot comes back and the token estimate is corrected."""
        if grant.released:
            return
        grant.released = True
        lease = self._leases.get(grant.tenant)
        if lease is None:
            return
        refund = grant.tokens - max(0, actual_tokens)  # < 0: used more than estimated
        if grant.window >= 0 and grant.window == lease.window:
            lease.tokens += refund
        if grant.month >= 0 and grant.month == lease.month:
            lease.budget += refund
        lease.touched = time.monotonic()
        lease.refusal = None  # capacity came back here: look again
        if not grant.slot:
            return
        lease.slots_used = max(0, lease.slots_used - 1)
        conc = lease.policy.max_concurrent
        slack = lease_chunk(conc, self._fraction) - 1 if conc else 0
        if lease.slots_held - lease.slots_used > slack:
            async with lease.lock:  # hand back the spare slots another replica may be waiting for
                try:
                    await resize_slots(
                        self.store,
                        grant.tenant,
                        lease,
                        slack,
                        replica_id=self.replica_id,
                        slot_ttl=self._slot_ttl,
                        clock=self._clock,
                    )
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("could not return %s's slots (they expire): %s", grant.tenant, exc)

    # -- background: renew slots, give back idle leases -----------------------------------
    async def _maintain(self) -> None:
        while True:
            await pause(self._tick)
            now, mono = self._clock(), time.monotonic()
            for tenant, lease in list(self._leases.items()):
                if lease.lock.locked():
                    continue
                idle = mono - lease.touched >= self._idle
                try:
                    async with lease.lock:
                        await settle(
                            self.store,
                            tenant,
                            lease,
                            now,
                            idle,
                            replica_id=self.replica_id,
                            slot_ttl=self._slot_ttl,
                            clock=self._clock,
                        )
                except (QuotaUnavailable, nats.errors.Error) as exc:
                    log.warning("quota upkeep for %s failed: %s", tenant, exc)
                if idle and lease.slots_held == 0 and mono - lease.touched > 600:
                    self._leases.pop(tenant, None)  # memory stays bounded by active tenants
