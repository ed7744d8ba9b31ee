"""The scheduler finds a dead worker by NATS interest, within about a second, where heartbeat
silence takes `stale_after` (3 missed beats of 2 s, and more under load): the stall a client of
that worker sees before its stream goes on elsewhere (broker/running.py, broker/sweep.py).

Each worker holds `lw.alive.w.<id>` for as long as it is connected (core/liveness.py). Every
PROBE_S the scheduler sends one request to each worker it has dispatched to and not seen end, and
to each whose pull it holds (so a worker is found alive before its first dispatch); no interest for GONE_S (three probes) and the worker is gone. No interest means no connection,
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
    nc: Client, s: Subjects, workers: Callable[[], Iterable[str]], silence: Silence, metrics: BrokerMetrics
) -> None:
    """Forever: probe the workers `workers()` names."""
    loop = asyncio.get_running_loop()
    while True:
        await pause(PROBE_S)
        ids = sorted(set(workers()))
        silence.keep(set(ids))
        if not ids:
            continue
        answers = await asyncio.gather(*(has_interest(nc, s.worker_alive(w)) for w in ids))
        now = loop.time()
        for worker, interest in zip(ids, answers, strict=True):
            metrics.worker_probes.labels("interest" if interest else "none").inc()
            silence.heard(worker, interest, now)
