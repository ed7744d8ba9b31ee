"""Work whose bridge is gone is cancelled in the engine.

A request names the bridge awaiting its frames (`GenerateRequest.edge`). That bridge subscribes
to `lw.alive.<edge>` for as long as it is connected, and answers nothing there. Every PROBE_S this
worker sends one request to each bridge its running requests name: nats-server answers "no
responders" at once when no connection holds that subscription (the bridge was SIGKILLed, crashed,
or lost NATS); otherwise the probe reaches the bridge and times out unanswered, which is the proof
of life. A bridge that shows no interest for GONE_S has its requests cancelled here as a client's
cancel would: the engine aborts them, their slots come back, and their usage records say
`cancelled` with the tokens made so far (not the whole `max_tokens` generated for nobody, and then
generated again by the bridge that takes its batch lines or background responses over).

Why NATS's interest, not a heartbeat the bridge sends: the server holds the interest for the
bridge's TCP connection, not for its event loop. A bridge busy for seconds (a blocked loop, a long
GC pause, even SIGSTOP) keeps it, so its streams are never cancelled for being slow, where a
missed-heartbeat rule would have to guess how slow a live bridge may be. Anything that goes wrong
on the probing side (this worker's loop late to read the answer, its NATS reconnecting) reads as a
timeout: as interest, never as a death.

Why GONE_S = 3: interest is missing only while the bridge has no connection, and a bridge that
loses its connection ends every open stream at once (`Losses.nats_lost`) and cancels their work
on reconnect anyway: a bridge that reconnects (nats-py retries every 0.5 s) loses nothing to this
rule that it had not lost already. The seconds only ride out interest still propagating between a
cluster's servers when a bridge reconnects to another one. A dead bridge's work stops within
GONE_S + PROBE_S + PROBE_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from nats.aio.client import Client

from core.liveness import Silence, has_interest
from core.tasks import pause
from schemas.subjects import Subjects
from workers.active import Active
from workers.engine import RequestKey
from workers.metrics import WorkerMetrics

log = logging.getLogger("laneway.worker")

PROBE_S = 1.0  # how often the bridges awaiting running requests are probed
GONE_S = 3.0  # no interest for this long: the bridge is gone, its work is cancelled


async def cancel_orphans(
    nc: Client,
    s: Subjects,
    active: Mapping[RequestKey, Active],
    cancel: Callable[[RequestKey, Active], Awaitable[None]],
    metrics: WorkerMetrics,
    pool: str,
    silence: Silence | None = None,
) -> None:
    """Forever: probe the bridges awaiting the running requests; cancel the work of those gone."""
    silence = silence or Silence(GONE_S)
    warned: set[str] = set()  # bound: one per bridge that ever ran work here
    loop = asyncio.get_running_loop()
    while True:
        await pause(PROBE_S)
        edges = {a.dispatch.request.edge for a in active.values() if a.dispatch.request.edge and not a.cancelled}
        silence.keep(edges)
        if not edges:
            continue
        ordered = sorted(edges)
        answers = await asyncio.gather(*(has_interest(nc, s.alive(edge)) for edge in ordered))
        now = loop.time()
        for edge, interest in zip(ordered, answers, strict=True):
            metrics.edge_probes.labels(pool, "interest" if interest else "none").inc()
            silence.heard(edge, interest, now)
        gone = {edge for edge in ordered if silence.gone(edge, now)}
        for edge in ordered:
            if silence.never_heard(edge, now) and edge not in warned:
                warned.add(edge)
                log.warning(
                    "bridge %s has never shown interest on %s: its work is not cancelled if it dies "
                    "(its NATS user may lack the right to subscribe there: regenerate the permissions)",
                    edge,
                    s.alive(edge),
                )
        for key, running in list(active.items()):
            if running.dispatch.request.edge in gone and not running.cancelled:
                log.info("request %s: its bridge %s is gone, cancelled", key.request_id, running.dispatch.request.edge)
                metrics.orphans.labels(pool).inc()
                await cancel(key, running)
