"""The worker's outbox: token frames grouped by reply inbox, then acks and control messages.

Entries for every stream bound to one inbox since the last flush travel as ONE `TokenFrame`
(nats-py costs ~17 µs of CPU per message, so a message per token per stream could not carry
thousands of streams). A flush runs at most once per `interval_s`: a GPU step is longer, so no
token waits on a GPU, while faster steps (the zero-delay sim, tiny models) coalesce, and a
stream's deltas that wait for the same flush merge into one entry (one SSE chunk at the edge).
Order matters and holds on one connection: dead letters are stored first, then the frames,
then what must follow them (a request's ack after its last entry, usage records, +WPI).
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client

from schemas import codec
from schemas.frames import Delta, Entry, TokenFrame
from workers.metrics import WorkerMetrics


class Outbox:
    def __init__(self, source: str, pool: str, metrics: WorkerMetrics, interval_s: float) -> None:
        self._source = source
        self._pool = pool
        self._metrics = metrics
        self._interval_s = interval_s
        self._frames: dict[str, list[Entry]] = {}
        self._open: dict[tuple[str, int], Delta] = {}     # (request, attempt) → its unsent delta
        self._after: list[tuple[str, bytes]] = []
        self._dead: list[tuple[str, bytes, dict[str, str]]] = []
        self._dirty = asyncio.Event()

    def emit(self, reply_to: str, entry: Entry) -> None:
        key = (entry.request_id, entry.attempt)
        if isinstance(entry, Delta):
            self._open[key] = entry
        else:
            self._open.pop(key, None)
        entries = self._frames.get(reply_to)
        if entries is None:
            self._frames[reply_to] = [entry]
        else:
            entries.append(entry)
        self._dirty.set()

    def extend(self, request_id: str, attempt: int, text: str, token_ids: list[int]) -> bool:
        """Append to this stream's delta that still waits for the flush; False when there is
        none (the caller emits a new `Delta` with the next seq)."""
        delta = self._open.get((request_id, attempt))
        if delta is None:
            return False
        delta.text += text
        delta.token_ids.extend(token_ids)
        return True

    def after(self, subject: str, payload: bytes) -> None:
        """Published after the frames of the same flush (acks, usage, in-progress)."""
        self._after.append((subject, payload))
        self._dirty.set()

    def dead_letter(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        """Stored (JetStream publish) before anything else of the flush, so before its TERM."""
        self._dead.append((subject, payload, headers))
        self._dirty.set()

    async def run(self, nc: Client) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0
        while True:
            await self._dirty.wait()
            wait = last + self._interval_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            last = loop.time()
            await self.flush(nc)

    async def flush(self, nc: Client) -> None:
        frames, self._frames = self._frames, {}
        self._open.clear()
        after, self._after = self._after, []
        dead, self._dead = self._dead, []
        for subject, payload, headers in dead:
            await nc.jetstream().publish(subject, payload, headers=headers)
        now = time.time()
        for reply_to, entries in frames.items():
            for payload in self._encode(entries, now, nc.max_payload):
                await nc.publish(reply_to, payload)
            self._metrics.entries_per_frame.labels(self._pool).observe(len(entries))
        if frames:
            self._metrics.frames.labels(self._pool).inc(len(frames))
        for subject, payload in after:
            await nc.publish(subject, payload)

    def _encode(self, entries: list[Entry], now: float, max_payload: int) -> list[bytes]:
        """One frame, unless it would exceed NATS max_payload: then halves, recursively."""
        payload = codec.encode(TokenFrame(self._source, entries, now))
        if len(payload) <= max_payload or len(entries) == 1:
            return [payload]
        half = len(entries) // 2
        return self._encode(entries[:half], now, max_payload) + self._encode(entries[half:], now, max_payload)
