"""A streamed answer's SSE events, numbered and kept, so that a client cut off mid-stream can
resume it from the last event it saw instead of generating again.

Each event carries `id: <edge_id>.<request_id>.<n>`: the bridge holding the stream (a resume
reaching another replica finds it by that), the request, and the event's position. `[DONE]`
carries none: a client that saw the last chunk but not `[DONE]` resumes after that chunk and
gets `[DONE]`. The request id is a random 128-bit (or HMAC) id, but the id is not the
credential: a resume must also come with the owning tenant's key.

One reader at a time takes entries from the request's `ResponseStream` (`follow`, under the
replay's lock): the client's connection while it is there, a keeper task while it is away (the
generation goes on and its events are kept). A resume takes over: it claims ownership, and the
former reader stops at its next look (its connection is aborted, its wait interrupted).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bridge.errors import EdgeError
from bridge.metrics import BridgeMetrics
from bridge.render.respond import Progress, Render, next_entries, render_entries
from bridge.render.sse import DONE
from bridge.streams.demux import ResponseStream
from schemas.errors import ErrorCode
from schemas.frames import Entry
from schemas.requests import GenerateRequest

LAST_EVENT_ID = "Last-Event-ID"
_EVENT_ID = re.compile(r"^([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{1,64})\.(0|[1-9][0-9]{0,8})$")

Sink = Callable[[list[bytes], int], Awaitable[None]]  # events, the position of the last one


class BadEventId(ValueError):
    def __init__(self, value: str) -> None:
        super().__init__(f"{LAST_EVENT_ID} must be an event id of a Laneway stream, as its `id:` lines carry")
        self.value = value


@dataclass(frozen=True, slots=True)
class EventId:
    edge_id: str
    request_id: str
    n: int

    @classmethod
    def parse(cls, raw: str) -> EventId:
        match = _EVENT_ID.match(raw.strip())
        if match is None:
            raise BadEventId(raw)
        return cls(match[1], match[2], int(match[3]))


class Trimmed(Exception):
    """The events after the asked position are no longer all held (the oldest were dropped)."""

    def __init__(self, oldest: int) -> None:
        super().__init__(f"the stream's events before event {oldest} are no longer held")
        self.oldest = oldest


class NotYet(Exception):
    """The asked position names an event this stream has not sent."""

    def __init__(self, count: int) -> None:
        super().__init__(f"this stream has sent {count} events so far")
        self.count = count


# Why a resume is refused: the same words whichever bridge holds the stream. A stream of another
# tenant is `unknown`, exactly as one that never existed.
UNKNOWN, TRIMMED, NOT_YET = "unknown", "trimmed", "not_yet"


def resume_error(kind: str, detail: str = "") -> EdgeError:
    if kind == TRIMMED:
        return EdgeError(
            ErrorCode.invalid_request,
            f"{detail}: the client fell too far behind to resume; send the request again",
            LAST_EVENT_ID,
            status=409,
            code_name="stream_trimmed",
        )
    if kind == NOT_YET:
        return EdgeError(
            ErrorCode.invalid_request,
            f"{LAST_EVENT_ID} names an event the stream has not sent ({detail})",
            LAST_EVENT_ID,
        )
    return EdgeError(
        ErrorCode.invalid_request,
        "no stream to resume has this event id (unknown, or ended longer ago than the resume window)",
        LAST_EVENT_ID,
        status=404,
        code_name="not_found",
    )


class Replay:
    """The events of one streamed answer, from `base` on (older ones were trimmed)."""

    __slots__ = (
        "edge_id",
        "generate",
        "path",
        "stream",
        "render",
        "_metrics",
        "_progress",
        "_id_prefix",
        "events",
        "base",
        "size",
        "finished",
        "owner",
        "abort",
        "lock",
        "cut",
        "detached",
        "expiry",
        "keeper",
        "on_grow",
        "limit",
        "settled",
    )

    def __init__(
        self,
        edge_id: str,
        generate: GenerateRequest,
        path: str,
        stream: ResponseStream,
        render: Render,
        metrics: BridgeMetrics,
        started: float,
        limit: int,
        on_grow: Callable[[Replay, int, int], None],
    ) -> None:
        self.edge_id = edge_id
        self.generate = generate
        self.path = path
        self.stream = stream
        self.render = render
        self._metrics = metrics
        self._progress = Progress(started)
        self._id_prefix = f"id: {edge_id}.{generate.request_id}.".encode()
        self.events: list[bytes] = []
        self.base = 0  # the position of events[0]
        self.size = 0  # bytes held in `events`
        self.limit = limit  # bytes held at most (the oldest go first while a client reads)
        self.finished = False  # the last event ([DONE]) is held
        self.owner: object | None = None  # who reads the stream now (a connection, a relay, the keeper)
        self.abort: Callable[[], None] | None = None  # stops the owner's connection
        self.lock = asyncio.Lock()  # held by the one reader of `stream`
        self.cut = False  # the client left before the end and has not come back
        self.detached = False  # no client: the keeper reads, the window runs
        self.expiry: asyncio.TimerHandle | None = None
        self.keeper: asyncio.Task[None] | None = None
        self.settled = False  # finished, its ResponseStream closed, its generation stopped
        self.on_grow = on_grow  # told after each batch: the bytes it added, the reader's position
        self._append(self.render.start())

    @property
    def tenant(self) -> str:
        return self.generate.tenant

    @property
    def request_id(self) -> str:
        return self.generate.request_id

    @property
    def count(self) -> int:
        return self.base + len(self.events)

    def add(self, entries: list[Entry]) -> None:
        """Render a batch of entries into numbered events. Called with no await between taking
        the entries and this: whatever a reader took is held before anyone else may read."""
        handed, before = self.count, self.size  # the events before `handed` went to the reader
        pieces, self.finished = render_entries(self.render, self.generate, entries, self._metrics, self._progress)
        for piece in pieces:
            self._append(piece)
        if not self.detached and self.size > self.limit:
            self._trim(handed, self.limit * 3 // 4)
        self.on_grow(self, self.size - before, handed)

    def _append(self, piece: bytes) -> None:
        # A piece is one event, or several for n > 1 choices: each gets its own id, so that a cut
        # between two of them resumes at the right one. orjson's JSON holds no raw newline.
        if piece.find(b"\n\n") == len(piece) - 2:  # one event: a delta, the hot path
            events: tuple[bytes, ...] = (piece,)
        else:
            events = tuple(event + b"\n\n" for event in piece.split(b"\n\n") if event)
        for event in events:
            if event != DONE:
                event = b"%s%d\n%s" % (self._id_prefix, self.base + len(self.events), event)
            self.events.append(event)
            self.size += len(event)

    def _trim(self, handed: int, keep: int) -> int:
        """Drop the oldest events, of those already handed to the reader, down to `keep` bytes
        (in bulk: a list's front); the bytes freed."""
        dropped, size = 0, self.size
        while dropped < handed - self.base and self.size > keep:
            self.size -= len(self.events[dropped])
            dropped += 1
        del self.events[:dropped]
        self.base += dropped
        return size - self.size

    def shed(self, handed: int, keep: int = 0) -> int:
        """Keep of the events before `handed` only the last `keep` bytes' worth (0: keep only
        what the reader has not had yet: its tenant holds too much); the bytes freed."""
        return self._trim(handed, keep)

    def since(self, after: int) -> tuple[list[bytes], int]:
        """The events after position `after` (-1: all), and the position of the last one."""
        if after >= self.count:
            raise NotYet(self.count)
        if after + 1 < self.base:
            raise Trimmed(self.base)
        return self.events[after + 1 - self.base :], self.count - 1

    def problem(self, after: int) -> tuple[str, str] | None:
        """Why a resume after `after` cannot be served (kind, detail); None when it can."""
        try:
            self.since(after)
        except Trimmed as exc:
            return TRIMMED, str(exc)
        except NotYet as exc:
            return NOT_YET, str(exc)
        return None

    def release_memory(self) -> None:
        self.events.clear()
        self.size = 0


async def follow(replay: Replay, token: object, sink: Sink | None, after: int) -> bool:
    """Hand `sink` the events after `after`, then the live rest as it comes, while `token` owns
    the replay. True once the last event went out; False when another reader took over."""
    async with replay.lock:
        while replay.owner is token:
            events, after = replay.since(after)
            if events and sink is not None:
                await sink(events, after)
            if replay.finished:
                return True
            if replay.owner is not token:
                break
            entries = await next_entries(replay.stream, replay.generate)
            if entries:  # none: interrupted, look who owns it now
                replay.add(entries)
    return False
