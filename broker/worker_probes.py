"""The scheduler finds a dead worker by NATS interest, within 0.5-0.75 s, where heartbeat
silence takes `stale_after` (3 missed beats of 2 s, and more under load): the stall a client of
that worker sees before its stream goes on elsewhere (broker/running.py, broker/sweep.py).

Each worker holds `lw.alive.w.<id>` for as long as it is connected (core/liveness.py). Every
PROBE_S the scheduler sends one request to each worker it has dispatched to and not seen end, and
to each whose pull it holds (so a worker is found alive before its first dispatch); no interest
for GONE_S (three probes) and the worker is gone, and the sweep is woken to hand its requests
back. No interest means no connection,
never a slow loop, so a worker that only falls behind keeps its work: that is what heartbeats
cannot tell apart. A worker that never subscribed (an older Laneway) is never found alive and
is left to the heartbeats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from nats.aio.client import Client

from broker.metrics import BrokerMetrics
from core.liveness import Silence, has_interest
from core.tasks import pause
from schemas.subjects import Subjects

PROBE_S = 0.25
GONE_S = 0.5  # no interest for this long (three probes): its connection is gone


async def probe_workers(
    nc: Client,
    s: Subjects,
    workers: Callable[[], Iterable[str]],
    silence: Silence,
    metrics: BrokerMetrics,
    found_gone: Callable[[], None],
) -> None:
    """Forever: probe the workers `workers()` names; `found_gone()` once one is gone (the sweep
    hands its requests back then, not at its next tick)."""
    loop = asyncio.get_running_loop()

    async def probe(worker: str) -> None:
        interest = await has_interest(nc, s.worker_alive(worker), timeout=PROBE_S)
        # Heard when the answer came: no responders comes at once, a live worker's timeout later.
        now = loop.time()
        metrics.worker_probes.labels("interest" if interest else "none").inc()
        silence.heard(worker, interest, now)
        if silence.gone(worker, now):
            found_gone()

    started = loop.time()
    while True:
        # A round every PROBE_S: a live worker's probe waits out its timeout (it never answers),
        # so that is the round's length too.
        await pause(max(0.0, started + PROBE_S - loop.time()))
        started = loop.time()
        ids = sorted(set(workers()))
        silence.keep(set(ids))
        if ids:
            await asyncio.gather(*(probe(w) for w in ids))
