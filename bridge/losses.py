"""What the bridge does when something under an open stream goes away: NATS (every stream ends
with `unavailable` at once; the routes' cancels wait in nats-py's reconnect buffer) or the
stream's worker (`worker_lost` once its heartbeats stop)."""

from __future__ import annotations

import asyncio
import logging

from bridge.demux import Demux
from bridge.readiness import Readiness
from schemas.errors import ErrorCode

log = logging.getLogger("laneway.bridge")

WORKER_LOST_CHECK_S = 1.0


class Losses:
    def __init__(self, demux: Demux, readiness: Readiness) -> None:
        self.demux = demux
        self.readiness = readiness
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
        failed = self.demux.fail_all(ErrorCode.unavailable,
                                     "Laneway lost its connection to NATS; retry shortly")
        if failed:
            log.warning("NATS lost: ended %d open streams with `unavailable`", failed)

    # -- worker loss ----------------------------------------------------------------------
    async def _watch_workers(self) -> None:
        """A stream whose worker stopped heartbeating ends with `worker_lost` instead of hanging
        until JetStream redelivers (which cannot help once tokens reached the client)."""
        while True:
            await asyncio.sleep(WORKER_LOST_CHECK_S)
            for stream in self.demux.streams():
                if (stream.streamed and not stream.closed and stream.source
                        and self.readiness.known(stream.source)
                        and not self.readiness.alive(stream.source)):
                    stream.fail(ErrorCode.worker_lost,
                                "the worker serving this request was lost after the stream started")
