"""One subscription per bridge instance, demultiplexed into per-request streams.

Entries are checked here so the routes only see a clean, ordered stream:
- an entry from an older delivery attempt than the newest seen is dropped (stale);
- a newer attempt after tokens already reached the client goes on only where its worker asked
  first and was told where to (bridge/streams/continuation.py: the attempt, the next `seq`);
  one that did not ask cannot be spliced into what the client saw, so the stream ends with
  `worker_lost` (the promise: never a silent truncation);
- a gap in `seq` (a lost frame) ends the stream with an error rather than skipping text.

What a slow reader may hold is bounded: a stream whose client does not read lets entries pile up
here, so past `BufferLimits.stream_bytes` buffered, or when its tenant's streams together pass
`BufferLimits.tenant_bytes`, the stream (the tenant's largest) ends with `slow_reader` and its
buffer is dropped. One tenant's stalled clients cannot fill the bridge's memory.

Open streams are counted by class and by tenant, for the bridge's admission (bridge/generate/admission.py):
per class, per (tenant, class), and how many tenants hold streams of each class.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.msg import Msg

from bridge.metrics import BridgeMetrics
from bridge.streams.lag import DeliveryLag
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, StreamError, Terminal

# Past its deadline a worker aborts the request; this grace covers its error frame's way back.
REPLY_GRACE_S = 5.0
STREAM_BUFFER_BYTES = 1024 * 1024  # ~250k tokens of text waiting: only a reader that stopped
TENANT_BUFFER_BYTES = 32 * 1024 * 1024
RESUME_TENANT_BYTES = 256 * 1024 * 1024  # ~4,000 answers of 400 tokens kept for resuming

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class BufferLimits:
    """Bytes of frames waiting for a client's reader: per stream, and over one tenant's streams.
    The events kept for resuming (bridge/resume/window.py) are bounded by `stream_bytes` per stream too,
    and by `resume_bytes` over one tenant's streams."""

    stream_bytes: int = STREAM_BUFFER_BYTES
    tenant_bytes: int = TENANT_BUFFER_BYTES
    resume_bytes: int = RESUME_TENANT_BYTES


class TenantShare:
    """What one tenant holds at this edge: its open streams (and how many of each class) and the
    bytes they buffer."""

    __slots__ = ("streams", "classes", "buffered", "on_overflow")

    def __init__(self, on_overflow: Callable[[str], None] = lambda reason: None) -> None:
        self.streams: set[ResponseStream] = set()
        self.classes: dict[str, int] = {}  # class → open streams (counted by the Demux: open to close)
        self.buffered = 0
        self.on_overflow = on_overflow  # told "stream" or "tenant": which limit ended a stream


class ResponseStream:
    __slots__ = (
        "request_id",
        "tenant",
        "klass",
        "attempt",
        "next_seq",
        "streamed",
        "closed",
        "_buffer",
        "_waiter",
        "source",
        "edge_failed",
        "expired",
        "_timer",
        "_share",
        "_limits",
        "buffered",
        "continuable",
        "tokens",
        "migrations",
        "lost_at",
        "_ids",
        "_texts",
        "__weakref__",
    )

    def __init__(
        self,
        request_id: str,
        tenant: str,
        expires_at: float,
        share: TenantShare | None = None,
        limits: BufferLimits = BufferLimits(),
        klass: str = "",
    ) -> None:
        self.request_id = request_id
        self.tenant = tenant
        self.klass = klass  # the class it was admitted as ('': none known)
        self.attempt = 0
        self.next_seq = 0
        self.streamed = False  # a delta has been handed to the route
        self.closed = False  # a terminal entry has been queued
        self.source = ""  # the worker serving the current attempt
        self.edge_failed = False  # ended here, not by its worker: the request may still run
        # What a continuation needs (bridge/streams/continuation.py): choice 0's tokens and text
        # as they came, while every delta was plain text; the workers it moved to; when its
        # worker was lost.
        self.continuable = True
        self.tokens = 0  # token ids the client got, of every choice (a lost worker's, metered by the next)
        self.migrations = 0
        self.lost_at: float | None = None
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._buffer: deque[Entry] = deque()
        self.buffered = 0  # bytes of frames in `_buffer`, as they came off the wire
        self._share = share or TenantShare()
        self._limits = limits
        self._waiter: asyncio.Future[None] | None = None
        # One timer per stream for its whole life, not a `wait_for` per wait: at thousands of
        # open streams a timer handle per token is a measurable share of the bridge's CPU.
        self.expired = False
        self._timer = asyncio.get_running_loop().call_later(max(0.0, expires_at - time.time()), self._expire)

    def feed(self, entry: Entry, source: str, size: int = 0) -> bool:
        """Queue an entry of `size` bytes; False if it was dropped as stale or after the end."""
        if self.closed or entry.attempt < self.attempt:
            return False
        if entry.attempt > self.attempt:
            if self.streamed:
                self.edge_failed = True
                entry = StreamError(
                    self.request_id,
                    entry.attempt,
                    0,
                    ErrorCode.worker_lost.value,
                    "the worker serving this request was lost after the stream started",
                )
            self.attempt = entry.attempt
            self.next_seq = 0
        if entry.seq != self.next_seq and not isinstance(entry, StreamError):
            # Frames were lost on the way (a worker's failed publish, a slow-consumer drop): a
            # delivery failure, worth a retry, not a fault in Laneway's code.
            self.edge_failed = True
            entry = StreamError(
                self.request_id,
                entry.attempt,
                entry.seq,
                ErrorCode.unavailable.value,
                f"lost part of the stream (expected chunk {self.next_seq}, got {entry.seq})",
            )
        self.next_seq = entry.seq + 1
        self.source = source
        if isinstance(entry, Delta):
            self.streamed = True
            self.tokens += len(entry.token_ids)
            if self.continuable:
                if entry.plain:
                    self._ids += entry.token_ids
                    self._texts.append(entry.text)
                else:
                    self.continuable = False
        elif isinstance(entry, Terminal):
            self.closed = True
        self._buffer.append(entry)
        self._hold(size)
        if self.buffered > self._limits.stream_bytes:
            self.overflow("stream")
        elif self._share.buffered > self._limits.tenant_bytes:
            max(self._share.streams, key=lambda s: s.buffered, default=self).overflow("tenant")
        self._wake()
        return True

    def delivered(self) -> tuple[list[int], str]:
        """Choice 0's token ids and text as they came (when `continuable`)."""
        text = "".join(self._texts)
        self._texts = [text]
        return self._ids, text

    def _hold(self, size: int) -> None:
        self.buffered += size
        self._share.buffered += size

    def overflow(self, limit: str) -> None:
        """The client is not reading: drop what waits for it and end the stream (its route cancels
        the generation). The text already written stays written; the error says why it stops."""
        self._hold(-self.buffered)
        self._buffer.clear()
        self._buffer.append(
            StreamError(
                self.request_id,
                self.attempt,
                self.next_seq,
                ErrorCode.slow_reader.value,
                f"the client did not read the stream: over {self._limits.stream_bytes} bytes waited for it"
                if limit == "stream"
                else f"the client did not read the stream: this tenant's streams held over "
                f"{self._limits.tenant_bytes} bytes at this edge",
            )
        )
        self.closed = self.edge_failed = True
        self._share.on_overflow(limit)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self) -> None:
        self.expired = True
        self._wake()

    def fail(self, code: ErrorCode, message: str) -> None:
        """End the stream from the edge's side (e.g. its worker stopped heartbeating)."""
        if not self.closed:
            self.edge_failed = True
            self.feed(StreamError(self.request_id, self.attempt, self.next_seq, code.value, message), self.source)

    async def next_entries(self) -> list[Entry]:
        """Everything queued so far (at least one entry, or none when interrupted); TimeoutError
        once `expires_at` passed."""
        if not self._buffer:
            if self.expired:
                raise TimeoutError
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not self._buffer:
                if self.expired:
                    raise TimeoutError
                return []  # interrupted: its reader is asked to look up (bridge/resume/replay.py)
        entries = list(self._buffer)
        self._buffer.clear()
        self._hold(-self.buffered)
        return entries

    def interrupt(self) -> None:
        """Wake the reader waiting in `next_entries` with nothing (another reader takes over)."""
        self._wake()

    def release(self) -> None:
        """Stop counting this stream against its tenant (its route is done with it)."""
        self._timer.cancel()
        self._hold(-self.buffered)
        self._share.streams.discard(self)


class Demux:
    def __init__(self, metrics: BridgeMetrics | None = None, limits: BufferLimits = BufferLimits()) -> None:
        self._streams: dict[str, ResponseStream] = {}
        self._tenants: dict[str, TenantShare] = {}
        self._classes: dict[str, int] = {}  # class → open streams
        self._holders: dict[str, int] = {}  # class → tenants holding streams of it
        self._metrics = metrics or BridgeMetrics()
        self.limits = limits
        self.lag = DeliveryLag()  # what admission reads: is this bridge keeping up?
        self.heard: dict[str, float] = {}  # worker id → when its last frame came (monotonic)

    def open(self, request_id: str, tenant: str, expires_at: float, klass: str = "") -> ResponseStream:
        """A stream for one request of class `klass` ('': none known; admission counts it with the
        last class); waiting on it past `expires_at` (unix time) raises TimeoutError."""
        share = self._tenants.get(tenant)
        if share is None:
            share = self._tenants[tenant] = TenantShare(self._slow_reader)
        stream = ResponseStream(request_id, tenant, expires_at, share, self.limits, klass)
        share.streams.add(stream)
        self._count(share, klass, 1)
        self._streams[request_id] = stream
        self._metrics.open_streams.set(len(self._streams))
        return stream

    def close(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.release()
            share = self._tenants.get(stream.tenant)
            if share is not None:
                self._count(share, stream.klass, -1)
                if not share.streams:
                    del self._tenants[stream.tenant]
        self._metrics.open_streams.set(len(self._streams))

    def _count(self, share: TenantShare, klass: str, step: int) -> None:
        """One stream of `klass` more (step 1) or fewer (-1): per class, per tenant, and the
        class's holders when the tenant's first comes or its last goes."""
        _add(self._classes, klass, step)
        _add(share.classes, klass, step)
        held = share.classes.get(klass, 0)
        if held == 0 or (held == 1 and step > 0):
            _add(self._holders, klass, step)

    def __len__(self) -> int:
        return len(self._streams)

    def _slow_reader(self, limit: str) -> None:
        self._metrics.slow_readers.labels(limit).inc()

    def held_by(self, tenant: str) -> int:
        """Open streams of one tenant at this edge."""
        share = self._tenants.get(tenant)
        return len(share.streams) if share else 0

    def by_class(self) -> Mapping[str, int]:
        """Open streams of each class at this edge (classes with none left out)."""
        return self._classes

    def classes_of(self, tenant: str) -> Mapping[str, int]:
        """One tenant's open streams of each class."""
        share = self._tenants.get(tenant)
        return share.classes if share else {}

    def holders(self, klass: str) -> int:
        """Tenants holding open streams of one class at this edge."""
        return self._holders.get(klass, 0)

    def buffered_by(self, tenant: str) -> int:
        share = self._tenants.get(tenant)
        return share.buffered if share else 0

    def get(self, request_id: str) -> ResponseStream | None:
        return self._streams.get(request_id)

    def streams(self) -> list[ResponseStream]:
        return list(self._streams.values())

    def fail_all(self, code: ErrorCode, message: str) -> int:
        """End every open stream from the edge's side; how many were still open."""
        failed = [s for s in self._streams.values() if not s.closed]
        for stream in failed:
            stream.fail(code, message)
        return len(failed)

    async def on_frame(self, msg: Msg) -> None:
        try:
            frame = codec.decode_frame(msg.data)
        except codec.DecodeError:
            return
        self._metrics.frames.inc()
        now = time.monotonic()
        if frame.source:
            self.heard[frame.source] = now  # a worker whose tokens arrive is alive
        if frame.sent_at:
            lag = max(0.0, time.time() - frame.sent_at)
            self._metrics.frame_lag.observe(lag)
            self.lag.observe(lag, now)
        # lw.tok.<tenant>.<edge>: a frame's entries may only touch that tenant's streams.
        tenant = msg.subject.split(".")[-2]
        streams = self._streams
        size = len(msg.data) // max(1, len(frame.entries))  # each entry's share of the frame's bytes
        for entry in frame.entries:
            stream = streams.get(entry.request_id)
            if stream is None or stream.tenant != tenant or not stream.feed(entry, frame.source, size):
                self._metrics.stale_entries.inc()


def _add(counts: dict[K, int], key: K, step: int) -> None:
    """Add `step` to a count, leaving no key at 0."""
    n = counts.get(key, 0) + step
    if n:
        counts[key] = n
    else:
        del counts[key]
