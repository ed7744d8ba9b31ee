"""Quotas on a real nats-server: every limit, the 429 data, and two replicas sharing counters.

The "replicas" are two `Quota` instances with their own NATS connections and replica ids over
one KV bucket, as two broker processes would be. A shared fake clock pins the minute window so
a test never straddles a window edge by accident.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from itertools import count

import nats
import pytest

from broker.gate.quota import (
    Quota,
    QuotaContended,
    QuotaExceeded,
    QuotaUnavailable,
    ensure_quota_bucket,
    rate_limit_headers,
)
from core.policy.quota import INSUFFICIENT_QUOTA, RATE_LIMITED, LimitName, QuotaPolicy
from schemas.subjects import Subjects
from tests.clock import T0, Clock

_prefixes = count()


@pytest.fixture
async def replicas(nats_server):
    """Two quota instances (own connections) over a fresh bucket, and their shared clock."""
    s = Subjects(f"q{next(_prefixes)}")
    clock = Clock()
    conns = [await nats.connect(nats_server.url) for _ in range(2)]
    quotas = [
        Quota(await ensure_quota_bucket(nc.jetstream(), s), clock=clock, replica_id=f"r{i}")
        for i, nc in enumerate(conns)
    ]
    yield quotas, clock
    for nc in conns:
        await nc.close()


async def admit_until_refused(
    quota: Quota, tenant: str, policy: QuotaPolicy, tokens: int, limit: int = 10_000
) -> tuple[int, QuotaExceeded]:
    for n in range(limit):
        try:
            await quota.admit(tenant, policy, tokens)
        except QuotaExceeded as exc:
            return n, exc
    raise AssertionError("never refused")


async def test_requests_per_minute_and_the_429_data(replicas) -> None:
    (quota, _), clock = replicas
    clock.set(T0)  # the fixture's set-up took time: 5 s into the minute from here
    policy = QuotaPolicy(requests_per_min=5, tokens_per_min=10_000)
    admitted, exc = await admit_until_refused(quota, "acme", policy, 100)
    assert admitted == 5
    assert exc.limit_name is LimitName.requests and exc.code == RATE_LIMITED
    assert (exc.limit, exc.remaining) == (5, 0)
    assert exc.reset_s == pytest.approx(55.0, abs=1)
    headers = rate_limit_headers(exc)
    assert headers["Retry-After"] in ("55", "56")
    assert headers["x-ratelimit-limit-requests"] == "5" and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == headers["Retry-After"] + "s"
    assert headers["x-ratelimit-limit-tokens"] == "10000"
    assert headers["x-ratelimit-remaining-tokens"] == str(10_000 - 5 * 100)
    clock.advance(60)  # the next minute starts from zero
    grant = await quota.admit("acme", policy, 100)
    assert grant.requests_state.remaining == 4 and grant.tokens_state.limit == 10_000


async def test_tokens_per_minute_with_release_correction(replicas) -> None:
    (quota, _), _ = replicas
    policy = QuotaPolicy(tokens_per_min=1000)
    grants = [await quota.admit("acme", policy, 300) for _ in range(3)]
    with pytest.raises(QuotaExceeded) as err:
        await quota.admit("acme", policy, 300)
    assert err.value.limit_name is LimitName.tokens and err.value.remaining == 100
    await quota.release(grants[0], actual_tokens=100)  # used 200 fewer than estimated
    await quota.admit("acme", policy, 300)
    with pytest.raises(QuotaExceeded, match="lower max_tokens"):
        await quota.admit("acme", policy, 5000)  # can never fit: says why


async def test_concurrency_slot_comes_back_on_release(replicas) -> None:
    (quota, _), _ = replicas
    policy = QuotaPolicy(max_concurrent=2)
    first = await quota.admit("acme", policy, 10)
    await quota.admit("acme", policy, 10)
    with pytest.raises(QuotaExceeded) as err:
        await quota.admit("acme", policy, 10)
    assert err.value.limit_name is LimitName.concurrency and err.value.retry_after_s == 1
    await quota.release(first, 10)
    await quota.release(first, 10)  # idempotent: one slot back, not two
    await quota.admit("acme", policy, 10)
    with pytest.raises(QuotaExceeded):
        await quota.admit("acme", policy, 10)


async def test_monthly_budget_is_insufficient_quota(replicas) -> None:
    (quota, other), clock = replicas
    policy = QuotaPolicy(monthly_tokens=1000)
    admitted, exc = await admit_until_refused(quota, "acme", policy, 250)
    assert admitted == 4
    assert exc.code == INSUFFICIENT_QUOTA and exc.limit_name is LimitName.budget
    assert exc.reset_s == pytest.approx(datetime(2026, 12, 1, tzinfo=UTC).timestamp() - T0, abs=5)
    with pytest.raises(QuotaExceeded):  # the other replica sees the same budget
        await other.admit("acme", policy, 250)
    clock.set(datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC).timestamp())
    await other.admit("acme", policy, 250)  # a new month


async def test_a_redelivered_request_is_charged_but_never_refused(replicas) -> None:
    (quota, other), _ = replicas
    policy = QuotaPolicy(requests_per_min=2, max_concurrent=2)
    await quota.admit("acme", policy, 1)
    await quota.admit("acme", policy, 1)
    forced = await quota.admit("acme", policy, 1, force=True)  # over both limits: a debt
    assert forced.slot
    with pytest.raises(QuotaExceeded):
        await other.admit("acme", policy, 1)


async def test_tenants_do_not_share_counters(replicas) -> None:
    (quota, _), _ = replicas
    policy = QuotaPolicy(requests_per_min=2)
    for tenant in ("a", "b"):
        assert (await admit_until_refused(quota, tenant, policy, 1))[0] == 2


async def test_unlimited_costs_no_round_trip(replicas) -> None:
    (quota, _), _ = replicas
    for _ in range(100):
        await quota.admit("free", QuotaPolicy(), 1000)
    assert quota.store.writes == quota.store.reads == 0


async def test_leases_amortize_round_trips(replicas) -> None:
    (quota, _), _ = replicas
    policy = QuotaPolicy(requests_per_min=1000, tokens_per_min=1_000_000)
    for _ in range(200):
        await quota.admit("busy", policy, 1000)
    # chunks of 10% (100 requests / 100K tokens): two refills for 200 requests, one write each
    assert quota.store.writes == 2 and quota.store.reads == 1


async def test_an_idle_lease_goes_back_to_the_other_replica(replicas) -> None:
    (a, b), clock = replicas
    policy = QuotaPolicy(requests_per_min=100)
    await a.admit("acme", policy, 1)  # a leases 10, uses 1
    admitted, _ = await admit_until_refused(b, "acme", policy, 1)
    assert admitted == 90  # 9 are stranded at a ...
    await a.close()  # ... until a gives them back
    clock.advance(1)  # (b trusts its last refusal for 0.5 s)
    more, _ = await admit_until_refused(b, "acme", policy, 1)
    assert 1 + admitted + more == 100


async def test_a_dead_replicas_slots_expire(nats_server) -> None:
    s, clock = Subjects(f"q{next(_prefixes)}"), Clock()
    async with await nats.connect(nats_server.url) as nc:
        kv = await ensure_quota_bucket(nc.jetstream(), s)
        dead = Quota(kv, replica_id="dead", clock=clock, slot_ttl_s=30)
        live = Quota(kv, replica_id="live", clock=clock, slot_ttl_s=30)
        policy = QuotaPolicy(max_concurrent=2)
        await dead.admit("acme", policy, 1)
        await dead.admit("acme", policy, 1)  # ... and it never releases or renews
        with pytest.raises(QuotaExceeded):
            await live.admit("acme", policy, 1)
        clock.advance(31)
        await live.admit("acme", policy, 1)


async def test_store_down_fails_open_or_closed(nats_server) -> None:
    s = Subjects(f"q{next(_prefixes)}")
    async with await nats.connect(nats_server.url) as nc:
        kv = await ensure_quota_bucket(nc.jetstream(), s)
        await nc.jetstream().delete_key_value(s.bucket("quota_use"))
        policy = QuotaPolicy(requests_per_min=10)
        grant = await Quota(kv, fail_open=True).admit("acme", policy, 1)
        assert not grant.released
        with pytest.raises(QuotaUnavailable):
            await Quota(kv, fail_open=False).admit("acme", policy, 1)


async def test_a_limit_fought_over_refuses_even_when_failing_open(nats_server) -> None:
    """Every write of ours loses to another writer on the real server: the store is up, so a
    fail-open quota must not read that as "down" and admit past the limit."""
    s = Subjects(f"q{next(_prefixes)}")
    async with await nats.connect(nats_server.url) as nc:
        kv = await ensure_quota_bucket(nc.jetstream(), s)
        update = kv.update

        async def update_after_a_rival(key, value, last=None):
            await kv.put(key, value)  # a rival's write lands between our read and our write
            return await update(key, value, last=last)

        kv.update = update_after_a_rival
        quota = Quota(kv, fail_open=True)
        with pytest.raises(QuotaContended):
            await quota.admit("acme", QuotaPolicy(max_concurrent=1), 1)
        assert quota.store.conflicts > 1 and quota.admitted == 0
        # Forced (a redelivery accepted long ago): a debt, never a refusal.
        assert not (await quota.admit("acme", QuotaPolicy(max_concurrent=1), 1, force=True)).released


@pytest.mark.parametrize("limit", [10, 100, 1000])
async def test_two_replicas_never_admit_more_than_the_rate(replicas, limit) -> None:
    (a, b), _ = replicas
    policy = QuotaPolicy(requests_per_min=limit, tokens_per_min=limit * 50)
    tenant = f"shared{limit}"

    async def one(quota: Quota) -> bool:
        try:
            await quota.admit(tenant, policy, random.randint(1, 50))
            return True
        except QuotaExceeded:
            return False

    results = await asyncio.gather(*(one(q) for _ in range(limit * 2) for q in (a, b)))
    admitted = sum(results)
    stats = (a.store.writes + b.store.writes, a.store.conflicts + b.store.conflicts)
    print(
        f"\nrpm={limit}: 2 replicas, {len(results)} concurrent admits -> {admitted} admitted "
        f"({admitted / limit:.1%} of the limit), KV writes={stats[0]} conflicts={stats[1]}"
    )
    assert admitted <= limit
    assert admitted >= limit * 0.9  # under-admission bounded by the stranded leases


async def test_two_replicas_never_exceed_the_concurrency_limit(replicas) -> None:
    (a, b), _ = replicas
    policy = QuotaPolicy(max_concurrent=8)
    in_flight = peak = admitted = 0

    async def request(quota: Quota) -> None:
        nonlocal in_flight, peak, admitted
        for _ in range(10):
            try:
                grant = await quota.admit("conc", policy, 10)
            except (QuotaExceeded, QuotaContended):  # a 429, or a 503 to retry
                await asyncio.sleep(0.001)  # scenario, kept: a refused client backs off and retries
                continue
            in_flight += 1
            admitted += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(random.uniform(0, 0.005))  # scenario, kept: holds its grant, so grants overlap
            in_flight -= 1
            await quota.release(grant, 10)

    await asyncio.gather(*(request(q) for _ in range(20) for q in (a, b)))
    print(f"\nmax_concurrent=8: 2 replicas x 20 clients -> {admitted} admitted, peak in flight {peak}")
    assert peak <= 8 and admitted > 0
