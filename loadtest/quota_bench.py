"""Benchmark: quota admission cost and accuracy with two broker replicas, and cache lookup cost.

    python -m loadtest.quota_bench [--nats-url URL] [--clients 64] [--requests 20000]

Starts an embedded nats-server (file store, JetStream) unless --nats-url is given. The two
"replicas" are two `Quota` instances with their own NATS connections, as two broker processes
would be (one event loop here, so the latencies include the other replica's CPU).

1. admit latency with leases (the default, 10% chunks) vs a KV compare-and-set per request
   (chunk of 1: what a naive shared counter costs), both replicas driven concurrently;
2. accuracy: 2x the limit offered concurrently to both replicas, for the rate, the token rate
   and concurrency; admitted vs limit (over-admission must be 0);
3. the response cache: key computation for a ~1.5K-token chat, hit and miss lookup latency.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import nats

from broker.gate.quota import Quota, QuotaExceeded, ensure_quota_bucket
from core.cache import CachedResponse, ResponseCache, cache_key
from core.natsd import NatsServer
from core.policy.quota import QuotaPolicy
from loadtest.stats import ms, summary
from schemas.frames import Delta
from schemas.openai import ChatBody, Message
from schemas.subjects import Subjects


def _line(name: str, values: list[float]) -> str:
    st = summary(values)
    return f"  {name:<52} n={st['n']:<6} p50={ms(st['p50']):>10}  p99={ms(st['p99']):>10}"


async def _replicas(url: str, s: Subjects, **options) -> tuple[list, list[Quota]]:
    conns = [await nats.connect(url) for _ in range(2)]
    kvs = [await ensure_quota_bucket(nc.jetstream(), s) for nc in conns]
    return conns, [Quota(kv, replica_id=f"r{i}", **options) for i, kv in enumerate(kvs)]


async def admit_latency(url: str, prefix: str, clients: int, requests: int, fraction: float) -> None:
    s = Subjects(prefix)
    conns, quotas = await _replicas(url, s, lease_fraction=fraction, budget_lease_fraction=min(fraction, 0.001))
    # Limits high enough that nothing is refused: this measures the admitted path.
    policy = QuotaPolicy(requests_per_min=10_000_000, tokens_per_min=10_000_000_000, monthly_tokens=10**14)
    label = f"lease {fraction:.0%} of the limit" if fraction >= 0.001 else "one KV CAS per request"

    async def client(quota: Quota, tenant: str, n: int, out: list[float]) -> None:
        for _ in range(n):
            start = time.perf_counter()
            grant = await quota.admit(tenant, policy, 1900)
            out.append(time.perf_counter() - start)
            await quota.release(grant, 1900)
            await asyncio.sleep(0)  # a broker serves other messages between admissions

    alone: list[float] = []
    await client(quotas[0], "solo", max(100, requests // 10), alone)
    print(_line(f"admit, {label}, 1 client", alone))
    latencies: list[float] = []
    per_client = max(1, requests // (2 * clients))
    before = sum(q.store.writes for q in quotas)
    started = time.perf_counter()
    await asyncio.gather(*(client(q, f"t{i % 4}", per_client, latencies) for i in range(clients) for q in quotas))
    wall = time.perf_counter() - started
    writes = sum(q.store.writes for q in quotas) - before
    conflicts = sum(q.store.conflicts for q in quotas)
    print(_line(f"admit, {label}, 2x{clients} clients", latencies))
    print(
        f"  {'':<52} {len(latencies) / wall:,.0f} admits/s, KV writes/admit="
        f"{writes / len(latencies):.4f}, CAS conflicts={conflicts}"
    )
    for nc in conns:
        await nc.close()


async def accuracy(url: str, prefix: str) -> None:
    cases = [
        ("requests_per_min=1000", QuotaPolicy(requests_per_min=1000), 2000),
        ("tokens_per_min=200000", QuotaPolicy(tokens_per_min=200_000), 2000),
        ("requests_per_min=20 (small)", QuotaPolicy(requests_per_min=20), 200),
    ]
    for i, (name, policy, offered) in enumerate(cases):
        conns, quotas = await _replicas(url, Subjects(f"{prefix}a{i}"))

        async def one(quota: Quota, policy: QuotaPolicy = policy) -> int:
            tokens = random.randint(100, 300)
            try:
                await quota.admit("acc", policy, tokens)
                return tokens
            except QuotaExceeded:
                return 0

        results = await asyncio.gather(*(one(quotas[n % 2]) for n in range(offered)))
        admitted = sum(1 for r in results if r)
        if policy.tokens_per_min:
            used, limit, unit = sum(results), policy.tokens_per_min, "tokens"
        else:
            assert policy.requests_per_min is not None  # each case sets one of the two
            used, limit, unit = admitted, policy.requests_per_min, "requests"
        print(
            f"  {name:<30} offered {offered} requests to 2 replicas: {used} {unit} admitted of "
            f"{limit} ({used / limit:.1%}), over-admitted {max(0, used - limit)}"
        )
        for nc in conns:
            await nc.close()

    conns, quotas = await _replicas(url, Subjects(f"{prefix}c"))
    policy = QuotaPolicy(max_concurrent=32)
    in_flight = peak = admitted = refused = 0

    async def worker(quota: Quota) -> None:
        nonlocal in_flight, peak, admitted, refused
        for _ in range(25):
            try:
                grant = await quota.admit("conc", policy, 10)
            except QuotaExceeded:
                refused += 1
                await asyncio.sleep(0.002)
                continue
            in_flight += 1
            admitted += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(random.uniform(0.001, 0.01))
            in_flight -= 1
            await quota.release(grant, 10)

    await asyncio.gather(*(worker(q) for _ in range(48) for q in quotas))
    print(
        f"  {'max_concurrent=32':<30} 96 clients on 2 replicas: peak in flight {peak} "
        f"(limit 32), {admitted} admitted, {refused} refused"
    )
    for nc in conns:
        await nc.close()


async def cache_latency(url: str, prefix: str, n: int) -> None:
    async with await nats.connect(url) as nc:
        cache = await ResponseCache.open(nc.jetstream(), Subjects(prefix), ttl_s=3600)
        messages = [
            Message("system", "You are a support assistant for <ORGANIZATION>."),
            Message("user", ("Summarise this ticket for the account team. " * 140)[:6000]),
        ]
        greedy = ChatBody(model="chat", messages=messages, max_tokens=400, temperature=0.0)
        text = "The customer reports a billing error. " * 40
        deltas = [Delta("r", 0, i, text[at : at + 32]) for i, at in enumerate(range(0, len(text), 32))]
        answer = CachedResponse(deltas, 1500, 400, "stop", "sim@1")
        key_times, hits, misses = [], [], []
        for _ in range(n):
            start = time.perf_counter()
            key = cache_key("t:acme", "chat", "r1", greedy, b"")
            key_times.append(time.perf_counter() - start)
        await cache.store(key, answer)
        for i in range(n):
            start = time.perf_counter()
            assert await cache.lookup(key) is not None
            hits.append(time.perf_counter() - start)
            miss = cache_key(f"t:acme{i}", "chat", "r1", greedy, b"")
            start = time.perf_counter()
            assert await cache.lookup(miss) is None
            misses.append(time.perf_counter() - start)
        print(_line("cache key (sha256 of a ~6 KB chat)", key_times))
        print(_line("cache lookup, hit (~1.5 KB answer)", hits))
        print(_line("cache lookup, miss", misses))


async def main(args: argparse.Namespace) -> None:
    server = None
    url = args.nats_url
    if url is None:
        server = NatsServer(Path(tempfile.mkdtemp(prefix="quota-bench-")))
        url = await server.start()
    try:
        print(f"quota admission: 2 replicas x {args.clients} clients, {args.requests} admits, 4 tenants")
        await admit_latency(url, "qb1", args.clients, args.requests, 0.1)
        await admit_latency(url, "qb2", args.clients, args.requests // 4, 1e-9)
        print("accuracy under concurrent load (2 replicas, separate connections):")
        await accuracy(url, "qb3")
        print("response cache:")
        await cache_latency(url, "qb4", args.cache_lookups)
    finally:
        if server is not None:
            await server.stop()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", help="an existing NATS with JetStream (default: start one)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients per replica")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--cache-lookups", type=int, default=2000)
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
