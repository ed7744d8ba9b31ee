"""Prefix and adapter affinity over one pool (the rules are broker/affinity.py's): a request's
chunk hashes, which parked pull takes the lanes' head, how a pulling worker scores an item, and
what a placement teaches the pool's index. The scheduler calls these when its `affinity` is on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.affinity import ADAPTER_TOKENS, Offer, choose, prefix_hashes
from broker.balance import could_take, load
from broker.metrics import BrokerMetrics
from broker.pools import Pool
from broker.waiting import Item
from schemas.requests import GenerateRequest
from schemas.work import Credit


def request_prefix(request: GenerateRequest, salt: str, adapter: str) -> tuple[int, ...]:
    """The prompt's chunk hashes from the tenant scope's salt (and the adapter: an adapter's KV is
    its own, as in vLLM's block hashes)."""
    if request.embedding is not None:
        return ()
    return prefix_hashes(request.body.texts(), f"{salt}\0{adapter}" if adapter else salt)


def best_parked(pool: Pool) -> int:
    """Which parked pull takes the next request: the one whose worker reaches its first token
    soonest (its cached prefix, its queued prefill), within the load balance; else the oldest."""
    if len(pool.parked) < 2:
        return 0
    head = pool.lanes.peek(time.time())
    if head is None or not (head.prefix or head.adapter):
        return 0
    able = [i for i, p in enumerate(pool.parked) if could_take(p.credit, head)]
    if not able:
        return 0
    now = time.monotonic()
    offers = [offer(pool.parked[i].credit, pool.index.share(pool.parked[i].credit.worker_id, now)) for i in able]
    overlaps = [pool.index.overlap(o.worker, head.prefix) for o in offers]
    unloaded = [bool(head.adapter) and head.adapter not in pool.parked[i].credit.adapters for i in able]
    return able[choose(offers, head.prompt, overlaps, unloaded)]


def preference(pool: Pool, credit: Credit) -> Callable[[Item], float]:
    """An item's score for this worker: the prefix it holds, less the most another holds (a
    request cached elsewhere is left for that worker's pull, one cached nowhere taken first),
    and likewise its LoRA adapter, loaded here or elsewhere."""
    now, worker, loaded = time.monotonic(), credit.worker_id, credit.adapters

    def score(item: Item) -> float:
        value = 0.0
        if item.prefix:
            value = pool.index.overlap(worker, item.prefix) - pool.index.best_elsewhere(worker, item.prefix, now)
        if item.adapter:
            if item.adapter in loaded:
                value += ADAPTER_TOKENS
            elif pool.index.adapter_elsewhere(worker, item.adapter, now):
                value -= ADAPTER_TOKENS
        return value

    return score


def placed(pool: Pool, credit: Credit, items: list[Item], metrics: BrokerMetrics) -> None:
    """Record where `items` went: the index learns the prefixes, the metrics whether it was a hit."""
    now = time.monotonic()
    for item in items:
        if item.prefix:
            here = pool.index.overlap(credit.worker_id, item.prefix)
            elsewhere = pool.index.best_elsewhere(credit.worker_id, item.prefix, now)
            outcome = "cold" if not (here or elsewhere) else ("hit" if here >= elsewhere else "miss")
            metrics.affinity.labels(credit.pool, outcome).inc()
            metrics.affinity_tokens.labels(credit.pool).inc(here)
        pool.index.record(credit.worker_id, item.prefix, now)
    if items:
        pool.index.forget_silent(now)


def offer(credit: Credit, share: float) -> Offer:
    return Offer(
        credit.worker_id, load(credit), sum(credit.prefill.values()), share, credit.total_slots, credit.step_tokens
    )
