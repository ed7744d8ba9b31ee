"""What the bridge does when something under an open stream goes away: NATS (every stream ends
with `unavailable` at once; cancels follow on reconnect) or the stream's worker (`worker_lost`
once its heartbeats stop)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker.bridge.readiness import Readiness
from broker.demux import Demux
from schemas.errors import ErrorCode

log = logging.getLogger("laneway.bridge")

WORKER_LOST_CHECK_S = 1.0


class Losses:
    def __init__(self, demux: Demux, readiness: Readiness,
                 cancel: Callable[[str, str], Awaitable[None]]) -> None:
        self.demux = demux
        self.readiness = readiness
        self._cancel = cancel
        self._tasks: list[asyncio.Task[None]] = []
        self._cancel_on_reconnect: list[tuple[str, str]] = []

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
        may still run once NATS is back, so cancels for them go out on reconnect."""
        failed = self.demux.fail_all(ErrorCode.unavailable,
                                     "Laneway lost its connection to NATS; retry shortly")
        self._cancel_on_reconnect += [(s.tenant, s.request_id) for s in failed]
        if failed:
            log.warning("NATS lost: ended %d open streams with `unavailable`", len(failed))

    def nats_back(self) -> None:
        pending, self._cancel_on_reconnect = self._cancel_on_reconnect, []
        for tenant, request_id in pending:
            self._tasks.append(asyncio.create_task(self._cancel(tenant, request_id)))
        self._tasks = [t for t in self._tasks if not t.done()]

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
