"""The streams this bridge holds for resuming (`--resume-window-s`), and their lives.

A streamed chat or completion is held from its first event. When its client goes away (or has
read the end: it may have missed the last events in flight), the stream is *detached*: a keeper
task reads on (the generation goes on, its events are kept) and the window starts. A resume
within the window takes it back (bridge/resume/routes.py, or bridge/resume/relay.py from another
replica); past the window the generation is cancelled, as it was at once before, and the
events are freed.

What streams hold for resuming is bounded by the bridge's `BufferLimits`: a stream keeps at
most `stream_bytes` of events (while its client reads, the oldest go; while it is away, it is
expired past that), and one tenant's streams `resume_bytes` together: past it, the tenant's
detached streams are expired, the cleanly ended ones first, oldest first, and then the streams
being read keep only what their clients have not had. A tenant cannot fill the bridge's
memory with abandoned streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from bridge.metrics import BridgeMetrics
from bridge.render.respond import Render
from bridge.resume.replay import Replay, follow
from bridge.streams.demux import BufferLimits, Demux, ResponseStream
from schemas.requests import GenerateRequest

log = logging.getLogger("laneway.bridge")

DEFAULT_WINDOW_S = 30.0


class _Held:
    """One tenant's share: the bytes its streams keep, and its detached streams, oldest first."""

    __slots__ = ("streams", "bytes", "clean", "cut")

    def __init__(self) -> None:
        self.streams = 0
        self.bytes = 0
        self.clean: dict[Replay, None] = {}  # read to the end: kept in case the last events were lost
        self.cut: dict[Replay, None] = {}  # the client left mid-stream

    def away(self, replay: Replay) -> dict[Replay, None]:
        return self.cut if replay.cut else self.clean

    def oldest_away(self) -> Replay | None:
        for detached in (self.clean, self.cut):
            if detached:
                return next(iter(detached))
        return None


class Resumes:
    def __init__(
        self,
        edge_id: str,
        window_s: float,
        limits: BufferLimits,
        demux: Demux,
        metrics: BridgeMetrics,
        cancel: Callable[[str, str], Coroutine[Any, Any, None]],  # run as a task
    ) -> None:
        self.edge_id = edge_id
        self.window_s = window_s
        self._limits = limits
        self._demux = demux
        self._metrics = metrics
        self._cancel = cancel
        self._held: dict[str, Replay] = {}  # request id → its replay
        self._tenants: dict[str, _Held] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # cancels being published

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    def __len__(self) -> int:
        return len(self._held)

    def open(
        self, generate: GenerateRequest, path: str, stream: ResponseStream, render: Render, started: float
    ) -> tuple[Replay, object]:
        """Hold a new stream, owned by the connection that asked for it (the token returned)."""
        replay = Replay(
            self.edge_id, generate, path, stream, render, self._metrics, started, self._limits.stream_bytes, self._grew
        )
        replay.owner = token = object()
        self._held[generate.request_id] = replay
        held = self._tenants.setdefault(replay.tenant, _Held())
        held.streams += 1
        held.bytes += replay.size
        return replay, token

    def find(self, tenant: str, request_id: str, path: str) -> Replay | None:
        """The tenant's stream of that id on that endpoint; another tenant's is not found."""
        replay = self._held.get(request_id)
        return replay if replay is not None and replay.tenant == tenant and replay.path == path else None

    def get(self, request_id: str) -> Replay | None:
        return self._held.get(request_id)

    def take(self, replay: Replay, token: object, abort: Callable[[], None] | None, via: str) -> None:
        """A resume claims the stream: the window stops, the former reader (the keeper, or a
        connection the client has not been seen to leave yet) stops at its next look."""
        previous = replay.abort
        replay.owner, replay.abort = token, abort
        if replay.expiry is not None:
            replay.expiry.cancel()
            replay.expiry = None
        if replay.detached:
            del self._tenants[replay.tenant].away(replay)[replay]
            replay.detached = replay.cut = False
        if replay.keeper is not None:
            replay.keeper.cancel()
            replay.keeper = None
        if previous is not None:
            previous()
        replay.stream.interrupt()
        self._metrics.resumed.labels(via).inc()

    async def release(self, replay: Replay, token: object, completed: bool) -> None:
        """The owner's connection ended: `completed` when it wrote the last event."""
        if replay.owner is not token:
            return  # taken over by a resume
        replay.abort = None
        self._detach(replay, cut=not completed)
        if replay.finished:
            await self._settle(replay)

    def let_go(self, replay: Replay, token: object) -> None:
        """The owner (a relay) was told its client left: keep the stream for the window."""
        if replay.owner is token:
            replay.abort = None
            self._detach(replay, cut=True)
            replay.stream.interrupt()

    def _detach(self, replay: Replay, cut: bool) -> None:
        replay.owner = keeper = object()
        replay.detached, replay.cut = True, cut
        held = self._tenants[replay.tenant]
        held.away(replay)[replay] = None
        # What a client that left may have missed is what was in flight: a socket's buffers. The
        # tail kept leaves room under `stream_bytes` for the events that come while it is away.
        held.bytes -= replay.shed(replay.count, self._limits.stream_bytes // 4)
        replay.expiry = asyncio.get_running_loop().call_later(self.window_s, self._expire, replay)
        if not replay.finished:
            replay.keeper = asyncio.create_task(self._keep(replay, keeper), name=f"keep-{replay.request_id}")
        self._grew(replay, 0, replay.count)

    async def _keep(self, replay: Replay, token: object) -> None:
        """Read on while no client is there; a finished stream is settled at once."""
        if await follow(replay, token, None, replay.count - 1) and replay.owner is token:
            replay.keeper = None
            await self._settle(replay)

    async def _settle(self, replay: Replay) -> None:
        """A finished stream needs its ResponseStream no more; one the edge ended (a slow reader,
        a lost frame) may still run on its worker: stop it now, not at the window's end."""
        if replay.settled:
            return
        replay.settled = True
        self._demux.close(replay.request_id)
        if replay.stream.edge_failed:
            await self._cancel(replay.tenant, replay.request_id)

    def _grew(self, replay: Replay, added: int, handed: int) -> None:
        """A stream holds `added` bytes more: past the limits, expire it, or the tenant's others."""
        if self._held.get(replay.request_id) is not replay:
            return  # expired while its last reader still held a batch
        held = self._tenants[replay.tenant]
        held.bytes += added
        if replay.detached and replay.size > self._limits.stream_bytes:
            self._expire(replay)
        while held.bytes > self._limits.resume_bytes:
            victim = held.oldest_away()
            if victim is None:
                held.bytes -= replay.shed(handed)
                return
            self._expire(victim)

    def _expire(self, replay: Replay) -> None:
        """Not resumed in time (or over the limits): free it, and stop its generation if it runs."""
        if self._held.get(replay.request_id) is not replay:
            return
        del self._held[replay.request_id]
        held = self._tenants[replay.tenant]
        held.away(replay).pop(replay, None)
        held.bytes -= replay.size
        held.streams -= 1
        if not held.streams:
            del self._tenants[replay.tenant]
        if replay.expiry is not None:
            replay.expiry.cancel()
        if replay.keeper is not None:
            replay.keeper.cancel()
        if replay.cut:
            self._metrics.expired.inc()
            log.debug("stream not resumed in %g s: %s", self.window_s, replay.request_id)
        replay.owner = None
        replay.stream.interrupt()
        stream_runs = not replay.settled and (replay.stream.edge_failed or not replay.stream.closed)
        replay.settled = True
        self._demux.close(replay.request_id)
        replay.release_memory()
        if stream_runs:
            task = asyncio.create_task(self._cancel(replay.tenant, replay.request_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for replay in list(self._held.values()):
            self._expire(replay)
        # The cancels go out before the bridge's NATS connection closes.
        await asyncio.gather(*self._tasks, return_exceptions=True)
