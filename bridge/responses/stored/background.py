"""Background responses (`background: true`): stored `queued` before the client is answered, then
generated with no client connection. One task per response follows its stream of entries and
keeps the stored record current: its status, a heartbeat every lease (`beat_at`, `lease_s`),
and, when streamed, its last SSE events (MAX_STORED_EVENT_BYTES), for `GET ...?stream=true`.

Each write expects the revision the task last wrote: a cancel (or a bridge that took this one
over) writing in between ends the task, and what it wrote stays. A running response is listed in
`lw_background` with its request (`Rerun`), so that when its bridge dies another runs it again
(`takeover.py`); a bridge that stops gives its responses up at once. One that cannot be run
again (its request too big to keep) ends failed instead: a background response is never lost
silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import nats.errors
import orjson

from bridge.errors import from_code
from bridge.render.responses import ResponsesRenderer
from bridge.responses.stored.lifecycle import lost
from bridge.responses.stored.store import Conflict, ResponseStore
from bridge.streams.demux import Demux, ResponseStream
from core.tasks import cancel_and_wait
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, Finished, StreamError
from schemas.stored import MAX_STORED_EVENT_BYTES, StoredResponse

log = logging.getLogger("laneway.bridge")

FLUSH_S = 0.25  # events and progress are written at most this often
LEASE_S = 5.0  # the heartbeat: a record not refreshed for STALE_LEASES of these is stale


@dataclass(slots=True, eq=False)
class Job:
    tenant: str
    stream: ResponseStream
    render: ResponsesRenderer
    ttl_s: int
    revision: int
    ended: Callable[[], StoredResponse]  # the record of the ended response (its input, history)
    stored: Callable[[], None]  # once that record is written: its turn added to its conversation
    rerunnable: bool = False  # its request is in lw_background: another bridge can run it
    events: list[bytes] = field(default_factory=list)
    first_event: int = 0
    event_bytes: int = 0
    started: bool = False  # streamed: its opening events are in `events` already
    ended_here: bool = False  # its end written by this task: unlisted on the way out

    @property
    def response_id(self) -> str:
        return self.render.id

    @property
    def key(self) -> str:
        return f"{self.tenant}.{self.response_id}"

    def take_events(self, chunk: bytes) -> None:
        if not chunk:
            return
        for event in chunk.split(b"\n\n"):
            if event:
                self.events.append(event + b"\n\n")
                self.event_bytes += len(event) + 2
        drop = 0
        while self.event_bytes > MAX_STORED_EVENT_BYTES and drop < len(self.events) - 1:
            self.event_bytes -= len(self.events[drop])
            drop += 1
        if drop:
            del self.events[:drop]
            self.first_event += drop


def queued(render: ResponsesRenderer, request_id: str, owner: str, lease_s: float, rerunnable: bool) -> StoredResponse:
    return StoredResponse(
        response=orjson.dumps(render.snapshot("queued")),
        request_id=request_id,
        owner=owner,
        beat_at=time.time(),
        lease_s=lease_s,
        rerunnable=rerunnable,
    )


class Background:
    def __init__(
        self,
        store: ResponseStore,
        demux: Demux,
        edge_id: str,
        cancel: Callable[[str, str], Awaitable[None]],
        lease_s: float = LEASE_S,
    ) -> None:
        self.store = store
        self.demux = demux
        self.edge_id = edge_id
        self.lease_s = lease_s
        self._cancel = cancel
        self._tasks: dict[str, asyncio.Task[None]] = {}  # key → the task running it here

    def run(self, job: Job) -> None:
        task = asyncio.create_task(self._run(job), name=f"background-{job.response_id}")
        self._tasks[job.key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(job.key, None))

    def runs(self, key: str) -> bool:
        return key in self._tasks

    async def stop(self) -> None:
        """The bridge stopping: its background responses are left to another bridge (or fail, if
        none can run them again), and their generations here stop."""
        for task in list(self._tasks.values()):
            await cancel_and_wait(task)

    async def _run(self, job: Job) -> None:
        request_id = job.stream.request_id
        try:
            await self._follow(job)
        except Conflict:
            pass  # written over (a cancel): what was written stays
        except asyncio.CancelledError:
            await self._give_up(job, leave=job.rerunnable)
            raise
        except nats.errors.Error as exc:
            # Unwritten, it reads stale in a few leases: taken over then, or marked failed.
            log.warning("background response %s: the store failed: %s", job.response_id, type(exc).__name__)
        except Exception:
            # The top of the response's task: a bug, not the request's fault. Logged with its
            # traceback, and the response ends failed: another bridge would meet the same bug.
            log.exception("background response %s failed", job.response_id)
            await self._give_up(job, leave=False)
        finally:
            self.demux.close(request_id)
            if not job.stream.closed or job.stream.edge_failed:
                await self._cancel(job.tenant, request_id)
            if job.rerunnable and job.ended_here:
                # Only the task that wrote the end unlists: one written over (a cancel, a takeover
                # by a bridge that found this one silent) leaves that to the sweep or the new owner.
                with contextlib.suppress(nats.errors.Error):
                    await self.store.unlist(job.tenant, job.response_id)

    async def _give_up(self, job: Job, *, leave: bool) -> None:
        """This bridge stopping (`leave`: the response is left for another bridge at once, its
        heartbeat zeroed) or a bug here (it fails now, not when a reader finds it stale). Best
        effort: the finally that follows stops its generation here."""
        try:
            if leave:
                await self._write(job, msgspec.structs.replace(self._progress(job, "in_progress"), beat_at=0.0))
            else:
                await self._write(job, lost(self._progress(job, "in_progress")))
                job.ended_here = True
        except (Conflict, nats.errors.Error):
            pass

    async def _write(self, job: Job, record: StoredResponse) -> None:
        job.revision = await self.store.put(job.tenant, job.response_id, record, job.ttl_s, after=job.revision)

    def _progress(self, job: Job, status: str) -> StoredResponse:
        return StoredResponse(
            response=orjson.dumps(job.render.snapshot(status)),
            request_id=job.stream.request_id,
            owner=self.edge_id,
            beat_at=time.time(),
            lease_s=self.lease_s,
            events=list(job.events),
            first_event=job.first_event,
            rerunnable=job.rerunnable,
        )

    async def _end(self, job: Job) -> None:
        """The ended record written; then, and only if this task wrote it, the conversation's turn."""
        record = job.ended()
        record.events, record.first_event = list(job.events), job.first_event
        await self._write(job, record)
        job.ended_here = True
        job.stored()

    async def _follow(self, job: Job) -> None:
        render, streaming = job.render, job.render.streaming
        if streaming and not job.started:
            job.take_events(render.start())
        status, written_at = "queued", time.monotonic()
        pending: asyncio.Future[list[Entry]] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(job.stream.next_entries())
                done, _ = await asyncio.wait({pending}, timeout=self.lease_s)
                if not done:
                    await self._write(job, self._progress(job, status))  # the heartbeat
                    written_at = time.monotonic()
                    continue
                try:
                    entries = pending.result()
                except TimeoutError:
                    entries = [
                        StreamError(
                            job.stream.request_id,
                            job.stream.attempt,
                            job.stream.next_seq,
                            ErrorCode.deadline_exceeded.value,
                            "no response before the deadline",
                        )
                    ]
                pending = None
                for entry in entries:
                    if isinstance(entry, Delta):
                        if streaming:
                            job.take_events(render.delta(entry))
                        else:
                            render.add(entry)
                    elif isinstance(entry, Finished):
                        await self._finished(job, entry)
                        return
                    else:
                        job.take_events(render.failed(from_code(entry.code, entry.message)))
                        await self._end(job)
                        return
                status = "in_progress"
                if time.monotonic() - written_at >= FLUSH_S:
                    await self._write(job, self._progress(job, status))
                    written_at = time.monotonic()
        finally:
            if pending is not None:
                pending.cancel()

    async def _finished(self, job: Job, finished: Finished) -> None:
        render = job.render
        if render.streaming:
            job.take_events(render.finish(finished))
        else:
            render.body(finished)
        if finished.finish_reason == "cancelled" and render.final is not None:
            render.final["status"] = "cancelled"
        await self._end(job)


async def mark_lost(
    store: ResponseStore,
    cancel: Callable[[str, str], Awaitable[None]],
    tenant: str,
    response_id: str,
    record: StoredResponse,
    revision: int,
    ttl_s: int,
) -> StoredResponse:
    """A stale background response: failed, for good (unless someone wrote it first), and its
    generation, if it still runs, stopped."""
    failed = lost(record)
    try:
        await store.put(tenant, response_id, failed, ttl_s, after=revision)
    except Conflict:
        found = await store.get(tenant, response_id)
        return found[0] if found is not None else failed
    await cancel(tenant, record.request_id)
    return failed
