"""Answering a generation from its stream of entries: SSE chunks, or one JSON object."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from bridge.errors import EdgeError, from_code
from bridge.metrics import BridgeMetrics
from bridge.render.chat import ChatRenderer, TextRenderer
from bridge.render.responses import ResponsesRenderer
from bridge.render.sse import DONE, error_event
from bridge.streams.demux import ResponseStream
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, Finished, StreamError
from schemas.requests import GenerateRequest

log = logging.getLogger("laneway.bridge")

Render = ChatRenderer | TextRenderer | ResponsesRenderer  # what streams


class Whole(Protocol):
    """What answering whole needs of a renderer: an embedding's (never streamed) has no more."""

    def add(self, delta: Delta) -> None: ...

    def body(self, finished: Finished) -> bytes: ...


class EventStream(web.StreamResponse):
    # The headers wait for the first chunk and leave in the same write (aiohttp's own
    # `web.Response` does this): one syscall fewer per streamed answer.
    _send_headers_immediately = False


def sse_response(headers: dict[str, str]) -> EventStream:
    return EventStream(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
    )


class SlowReader(Exception):
    """A write waited past its timeout: the client's socket is full and it is not reading."""


class Writer:
    """Each write of one SSE response, bounded: a client that stops reading holds a write (and
    the buffers behind it) at most `timeout_s` (0: unbounded)."""

    __slots__ = ("response", "timeout_s")

    def __init__(self, response: web.StreamResponse, timeout_s: float) -> None:
        self.response = response
        self.timeout_s = timeout_s or None

    async def write(self, data: bytes, *, eof: bool = False) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await (self.response.write_eof(data) if eof else self.response.write(data))
        except TimeoutError:
            raise SlowReader from None


async def stream_sse(
    request: web.Request,
    stream: ResponseStream,
    generate: GenerateRequest,
    render: Render,
    entries: list[Entry],
    started: float,
    metrics: BridgeMetrics,
    headers: dict[str, str],
    write_timeout_s: float,
) -> web.StreamResponse:
    """Server-sent events; errors after the first byte go in-band, then [DONE] (the Responses API:
    `response.failed`, and no [DONE])."""
    return await serve_sse(
        request,
        headers,
        generate.request_id,
        metrics,
        write_timeout_s,
        lambda writer: _write_stream(writer, stream, generate, render, entries, started, metrics),
    )


async def serve_sse(
    request: web.Request,
    headers: dict[str, str],
    request_id: str,
    metrics: BridgeMetrics,
    write_timeout_s: float,
    write: Callable[[Writer], Awaitable[object]],
) -> EventStream:
    """An SSE response whose events `write` writes; a client that left, or stopped reading, ends it."""
    response = sse_response(headers)
    try:
        await response.prepare(request)
        await write(Writer(response, write_timeout_s))
    except ConnectionResetError:
        log.debug("client left mid-stream: %s", request_id)  # the caller cancels
    except SlowReader:
        # Nothing more can reach this client: drop the connection and what it buffers. The
        # caller cancels the generation (the stream did not end).
        log.info("client stopped reading for %g s; stream ended: %s", write_timeout_s, request_id)
        metrics.slow_readers.labels("write_timeout").inc()
        if request.transport is not None:
            request.transport.abort()
    return response


def _include_usage(generate: GenerateRequest) -> bool:
    options = generate.body.stream_options
    return bool(options and options.include_usage)


class Progress:
    """What the metrics need across one stream's batches: whether its first token went out."""

    __slots__ = ("started", "first_token")

    def __init__(self, started: float) -> None:
        self.started = started
        self.first_token = True


def render_entries(
    render: Render, generate: GenerateRequest, entries: list[Entry], metrics: BridgeMetrics, progress: Progress
) -> tuple[list[bytes], bool]:
    """The SSE events of a batch of entries, and whether the stream's last event is among them."""
    out: list[bytes] = []
    metrics.tokens.labels(generate.klass).inc(sum(len(e.token_ids) or 1 for e in entries if isinstance(e, Delta)))
    for entry in entries:
        if isinstance(entry, Delta):
            if progress.first_token:
                metrics.ttft.labels(generate.klass, generate.tenant).observe(time.monotonic() - progress.started)
                progress.first_token = False
            out.append(render.delta(entry))
        elif isinstance(entry, Finished):
            out.append(render.finish(entry))
            if _include_usage(generate):
                out.append(render.usage_chunk(entry))
            if not isinstance(render, ResponsesRenderer):
                out.append(DONE)
            metrics.e2e.labels(generate.klass).observe(time.monotonic() - progress.started)
            return out, True
        else:  # StreamError after the stream started: in-band, then [DONE]
            err = from_code(entry.code, entry.message)
            out += [render.failed(err)] if isinstance(render, ResponsesRenderer) else [error_event(err.body()), DONE]
            return out, True
    return out, False


async def next_entries(stream: ResponseStream, generate: GenerateRequest) -> list[Entry]:
    """The stream's next entries; past the deadline, the error that ends it."""
    try:
        return await stream.next_entries()
    except TimeoutError:
        return [
            StreamError(
                generate.request_id,
                stream.attempt,
                stream.next_seq,
                ErrorCode.deadline_exceeded.value,
                "no response before the deadline",
            )
        ]


async def _write_stream(
    response: Writer,
    stream: ResponseStream,
    generate: GenerateRequest,
    render: Render,
    entries: list[Entry],
    started: float,
    metrics: BridgeMetrics,
) -> None:
    out = [render.start()]
    progress = Progress(started)
    while True:
        events, done = render_entries(render, generate, entries, metrics, progress)
        out += events
        if done and isinstance(render, ResponsesRenderer) and render.before_end is not None:
            await render.before_end()
        # The last chunk and the terminator: one write.
        await response.write(b"".join(out), eof=done)
        if done:
            return
        out.clear()
        entries = await next_entries(stream, generate)


async def collect_json(
    stream: ResponseStream,
    generate: GenerateRequest,
    render: Whole,
    entries: list[Entry],
    started: float,
    metrics: BridgeMetrics,
    headers: dict[str, str],
) -> web.Response:
    """One `chat.completion` (or `text_completion`) object once the stream has finished."""
    body = await collect_body(stream, generate, render, entries, started, metrics)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def collect_body(
    stream: ResponseStream,
    generate: GenerateRequest,
    render: Whole,
    entries: list[Entry],
    started: float,
    metrics: BridgeMetrics,
) -> bytes:
    """The answer's JSON body once the stream has finished; an in-band error raises EdgeError."""
    tokens = 0
    klass = generate.klass
    while True:
        for entry in entries:
            if isinstance(entry, Delta):
                if not tokens:
                    metrics.ttft.labels(klass, generate.tenant).observe(time.monotonic() - started)
                render.add(entry)
                tokens += len(entry.token_ids) or 1
            elif isinstance(entry, Finished):
                metrics.tokens.labels(klass).inc(tokens)
                metrics.e2e.labels(klass).observe(time.monotonic() - started)
                return render.body(entry)
            else:
                raise from_code(entry.code, entry.message)
        try:
            entries = await stream.next_entries()
        except TimeoutError:
            raise EdgeError(ErrorCode.deadline_exceeded, "no response before the deadline") from None
