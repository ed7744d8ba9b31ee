"""The worker's outbox: token frames grouped by reply inbox, then acks and control messages.

Entries for every stream bound to one inbox since the last flush travel as ONE `TokenFrame`
(nats-py costs ~17 µs of CPU per message, so a message per token per stream could not carry
thousands of streams). A flush runs at most once per `interval_s`: a GPU step is longer, so no
token waits on a GPU, while faster steps (the zero-delay sim, tiny models) coalesce, and a
stream's deltas that wait for the same flush merge into one entry (one SSE chunk at the edge).
Order matters and holds on one connection: dead letters are stored first, then the frames,
then what must follow them (a request's ack after its last entry, +WPI), then usage records.

A failed publish never stops the flusher. It is counted (`laneway_worker_publish_failures_total`
by kind) and logged, and what it carried is dropped on purpose:
- a token frame: its streams are marked lost. The edge ends such a stream at the seq gap, and its
  usage meters only the tokens of frames published before (`Delivery`).
- a dead letter: its request's TERM is withheld, so the message stays unacked and the broker
  dead-letters it from JetStream's max-deliveries advisory instead.
- a +WPI or usage record: JetStream redelivers an unacked request after ack_wait.
A request's final ack (+ACK, +TERM) is sent as a request and retried until the server confirms
it: a plain ack the server drops (it does while it restores a consumer after a restart) would
have the request delivered, and generated, again after ack_wait.
Frames go out only on a live connection. nats-py would buffer them through a reconnect, but they
would land after the edge gave the stream up, and a token counts as delivered only once its
frame was published. Acks and usage records are still right late: those are buffered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client

from core.tasks import pause
from schemas import codec
from schemas.frames import Delta, Entry, TokenFrame
from workers.metrics import WorkerMetrics

log = logging.getLogger("laneway.worker.outbox")

# (reply inbox, request_id, attempt). Request ids are the client's, so two tenants may stream
# under the same one at once: the inbox (`lw.tok.<tenant>.…`, checked in workers/serve.py) keeps
# one tenant's deltas from merging into, or being counted for, another's.
StreamKey = tuple[str, str, int]


@dataclass(slots=True)
class Delivery:
    """What of one stream went out: tokens in its frames published before any of its frames
    failed, and whether one did (the stream then never reached its end at the edge)."""

    tokens: int = 0
    lost: bool = False


class _Failures:
    """Publish failures, logged when a run of them starts and when publishing works again: a
    disconnected worker would otherwise log every flush."""

    def __init__(self, metrics: WorkerMetrics, pool: str) -> None:
        self._metrics = metrics
        self._pool = pool
        self._counts: dict[str, int] = {}
        self.this_flush = 0

    def record(self, kind: str, subject: str, error: str) -> None:
        self._metrics.publish_failures.labels(self._pool, kind).inc()
        if not self._counts:
            log.warning(
                "publishing a %s to %s failed (%s); dropping what cannot be published until publishing works again",
                kind,
                subject,
                error,
            )
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self.this_flush += 1

    def settle(self) -> None:
        """End of a flush: one without failures ends the run."""
        if self.this_flush == 0 and self._counts:
            log.warning("publishing works again; dropped meanwhile: %s", self._counts)
            self._counts = {}
        self.this_flush = 0


FINAL_ACKS = frozenset((b"+ACK", b"+TERM"))
CONFIRM_TRIES = 8  # ~8 s of tries: well inside ack_wait
CONFIRM_TIMEOUT_S = 1.0


class Outbox:
    def __init__(self, source: str, pool: str, metrics: WorkerMetrics, interval_s: float) -> None:
        self._source = source
        self._pool = pool
        self._metrics = metrics
        self._interval_s = interval_s
        self._frames: dict[str, list[Entry]] = {}
        self._open: dict[StreamKey, Delta] = {}  # a stream's delta that waits for the flush
        self._tokens: dict[StreamKey, int] = {}  # ... and the tokens it carries
        self._after: list[tuple[str, bytes]] = []
        self._metered: list[tuple[str, StreamKey, Callable[[Delivery], bytes]]] = []
        self._dead: list[tuple[str, bytes, dict[str, str], str]] = []
        self._sent: dict[StreamKey, Delivery] = {}  # until the stream's usage is built
        self._failures = _Failures(metrics, pool)
        self._dirty = asyncio.Event()
        self._confirming: set[asyncio.Task[None]] = set()

    def emit(self, reply_to: str, entry: Entry) -> None:
        key = (reply_to, entry.request_id, entry.attempt)
        if isinstance(entry, Delta):
            self._tokens[key] = self._tokens.get(key, 0) + (len(entry.token_ids) or 1)
        if isinstance(entry, Delta) and entry.plain:
            self._open[key] = entry
        else:
            self._open.pop(key, None)  # later text must not merge across it
        entries = self._frames.get(reply_to)
        if entries is None:
            self._frames[reply_to] = [entry]
        else:
            entries.append(entry)
        self._dirty.set()

    def extend(self, key: StreamKey, text: str, token_ids: list[int]) -> bool:
        """Append to this stream's delta that still waits for the flush; False when there is
        none (the caller emits a new `Delta` with the next seq)."""
        delta = self._open.get(key)
        if delta is None:
            return False
        delta.text += text
        delta.token_ids.extend(token_ids)
        self._tokens[key] += len(token_ids) or 1  # an engine without token ids: one per delta
        return True

    def after(self, subject: str, payload: bytes) -> None:
        """Published after the frames of the same flush (acks, in-progress)."""
        self._after.append((subject, payload))
        self._dirty.set()

    def metered(self, subject: str, key: StreamKey, build: Callable[[Delivery], bytes]) -> None:
        """A usage record, built at the flush once the stream's last frames went out (or failed
        to): `build` gets what was delivered. Call it after the stream's last entry."""
        self._metered.append((subject, key, build))
        self._dirty.set()

    def dead_letter(self, subject: str, payload: bytes, headers: dict[str, str], ack_subject: str) -> None:
        """Stored (JetStream publish) before anything else of the flush, so before its TERM;
        if it cannot be stored, that TERM (`ack_subject`) is withheld."""
        self._dead.append((subject, payload, headers, ack_subject))
        self._dirty.set()

    async def run(self, nc: Client) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0
        while True:
            await self._dirty.wait()
            wait = last + self._interval_s - loop.time()
            if wait > 0:
                await pause(wait)
            self._dirty.clear()
            last = loop.time()
            await self.flush(nc)

    async def flush(self, nc: Client) -> None:
        frames, self._frames = self._frames, {}
        tokens, self._tokens = self._tokens, {}
        self._open.clear()
        after, self._after = self._after, []
        metered, self._metered = self._metered, []
        dead, self._dead = self._dead, []
        withheld = await self._store_dead(nc, dead) if dead else ()
        now = time.time()
        for reply_to, entries in frames.items():
            for part, payload in self._encode(entries, now, nc.max_payload):
                try:
                    if not nc.is_connected:
                        raise nats.errors.ConnectionReconnectingError
                    await nc.publish(reply_to, payload)
                except nats.errors.Error as exc:
                    self._failures.record("frame", reply_to, repr(exc))
                    self._count(reply_to, part, tokens, lost=True)
                else:
                    self._count(reply_to, part, tokens, lost=False)
            self._metrics.entries_per_frame.labels(self._pool).observe(len(entries))
        if frames:
            self._metrics.frames.labels(self._pool).inc(len(frames))
        for subject, payload in after:
            if subject in withheld:
                continue
            if payload in FINAL_ACKS:
                task = asyncio.create_task(self._confirmed(nc, subject, payload))
                self._confirming.add(task)
                task.add_done_callback(self._confirming.discard)
            else:
                await self._publish(nc, "control", subject, payload)
        for subject, key, build in metered:
            await self._publish(nc, "usage", subject, build(self._sent.pop(key, Delivery())))
        self._failures.settle()

    async def _confirmed(self, nc: Client, subject: str, payload: bytes) -> None:
        """A final ack, until JetStream answers that it applied it (AckSync)."""
        for attempt in range(CONFIRM_TRIES):
            try:
                await nc.request(subject, payload, timeout=CONFIRM_TIMEOUT_S)
                return
            except (TimeoutError, nats.errors.Error) as exc:  # no answer yet: again
                error = repr(exc)
            await pause(min(2.0, 0.1 * 2**attempt))
        self._failures.record("control", subject, f"no confirmation after {CONFIRM_TRIES} tries: {error}")

    async def confirmed(self, timeout_s: float) -> None:
        """Until the final acks in flight are confirmed (a stopping worker waits for them)."""
        if self._confirming:
            await asyncio.wait(set(self._confirming), timeout=timeout_s)

    def _count(self, reply_to: str, entries: list[Entry], tokens: dict[StreamKey, int], lost: bool) -> None:
        """Credit the deltas of a published frame to their streams, until one of theirs fails."""
        for entry in entries:
            key = (reply_to, entry.request_id, entry.attempt)
            sent = self._sent.get(key)
            if sent is None:
                sent = self._sent[key] = Delivery()
            if lost:
                sent.lost = True
            elif not sent.lost and isinstance(entry, Delta):
                sent.tokens += tokens.get(key, 0)

    async def _store_dead(self, nc: Client, dead: list[tuple[str, bytes, dict[str, str], str]]) -> set[str]:
        """Store the dead letters; the ack subjects whose TERM must now be withheld."""
        withheld = set()
        for subject, payload, headers, ack_subject in dead:
            try:
                if not nc.is_connected:  # a JetStream publish would wait out its timeout
                    raise nats.errors.ConnectionReconnectingError
                await nc.jetstream().publish(subject, payload, headers=headers)
            except nats.errors.Error as exc:
                withheld.add(ack_subject)
                self._failures.record("dead_letter", subject, repr(exc))
                log.error(
                    "could not store a dead letter on %s (%r, attempt %s); its TERM is withheld, "
                    "so the broker dead-letters it after max deliveries",
                    subject,
                    exc,
                    headers.get("Laneway-Attempt"),
                )
        return withheld

    async def _publish(self, nc: Client, kind: str, subject: str, payload: bytes) -> None:
        try:
            await nc.publish(subject, payload)  # buffered by nats-py while reconnecting
        except nats.errors.Error as exc:
            self._failures.record(kind, subject, repr(exc))

    def _encode(self, entries: list[Entry], now: float, max_payload: int) -> list[tuple[list[Entry], bytes]]:
        """One frame, unless it would exceed NATS max_payload: then halves, recursively."""
        payload = codec.encode(TokenFrame(self._source, entries, now))
        if len(payload) <= max_payload or len(entries) == 1:
            return [(entries, payload)]
        half = len(entries) // 2
        return self._encode(entries[:half], now, max_payload) + self._encode(entries[half:], now, max_payload)
