"""What the bridge does when something under an open stream goes away: NATS (every stream ends
with `unavailable` at once; the routes' cancels wait in nats-py's reconnect buffer) or the
stream's worker (once it falls silent: no heartbeat and no frame). A stream that can go on
elsewhere waits the consumer's ack_wait and `CONTINUE_MARGIN_S` for the worker its request is delivered to next
(bridge/streams/continuation.py); one that cannot, or whose continuation does not come, ends with
`worker_lost`.

A busy worker is not a dead one. Its silence is judged against `stale_after` (3 missed beats,
stretched by the loop lag the worker itself last reported) plus this bridge's own lateness (its
loop lag, its frames' delivery lag): a beat may be sitting in this bridge's buffers, unread. A
SIGKILLed worker on an unloaded bridge is still found within `stale_after` + one check."""

from __future__ import annotations

import asyncio
import logging
import time

from bridge.readiness import Readiness
from bridge.streams.continuation import LOST_MESSAGE
from bridge.streams.demux import Demux
from core.looplag import LoopLag
from core.tasks import pause
from schemas.errors import ErrorCode

log = logging.getLogger("laneway.bridge")

WORKER_LOST_CHECK_S = 1.0
HEARD_KEEP_S = 600.0  # a worker silent this long is forgotten by the frame record
# How long a stream whose worker was lost waits for its continuation: the redelivery comes at once
# when the scheduler saw the loss, else after the consumer's ack_wait (`Readiness.redelivery_within`,
# as the brokers say it), and then this margin for the new worker's start.
CONTINUE_MARGIN_S = 5.0


class Losses:
    def __init__(self, demux: Demux, readiness: Readiness, loop_lag: LoopLag) -> None:
        self.demux = demux
        self.readiness = readiness
        self.loop_lag = loop_lag
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._watch_workers(), name="worker-lost"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- NATS lost ------------------------------------------------------------------------
    def nats_lost(self) -> None:
        """Without NATS no frame can arrive and no request can be stored: end every open stream
        now with a clear error instead of letting clients wait out their deadlines. Their work
        may still run once NATS is back: each route then publishes its cancel, which nats-py
        buffers and sends on reconnect."""
        failed = self.demux.fail_all(ErrorCode.unavailable, "Laneway lost its connection to NATS; retry shortly")
        if failed:
            log.warning("NATS lost: ended %d open streams with `unavailable`", failed)

    # -- worker loss ----------------------------------------------------------------------
    async def _watch_workers(self) -> None:
        """A stream whose worker stopped heartbeating waits for its continuation, a bounded
        while; one that cannot continue ends with `worker_lost` at once instead of hanging."""
        heard = self.demux.heard
        while True:
            await pause(WORKER_LOST_CHECK_S)
            now = time.monotonic()
            slack = max(self.loop_lag.current(now), self.demux.lag.current(now))
            lost: set[str] = set()
            within = self.readiness.redelivery_within() + CONTINUE_MARGIN_S
            for stream in self.demux.streams():
                source = stream.source
                if not (stream.streamed and not stream.closed and source and self.readiness.known(source)):
                    continue
                if self.readiness.alive(source, now, heard_at=heard.get(source), slack_s=slack):
                    stream.lost_at = None  # back (it was only slow): a later silence counts afresh
                    continue
                # An engine that cannot continue (a hosted API) will not: end it now.
                goes_on = stream.continuable and self.readiness.continues(source)
                if goes_on and stream.lost_at is None:
                    stream.lost_at = now
                    lost.add(source)
                elif not goes_on or now - (stream.lost_at or now) > within:
                    stream.fail(
                        ErrorCode.worker_lost,
                        f"{LOST_MESSAGE} (no worker continued it)" if goes_on else LOST_MESSAGE,
                    )
                    lost.add(source)
            for worker in lost:
                log.warning(
                    "worker %s silent past its bound (this bridge %.1f s late): its streams wait "
                    "for a continuation or end",
                    worker,
                    slack,
                )
            for worker, at in list(heard.items()):
                if now - at > HEARD_KEEP_S:
                    del heard[worker]
