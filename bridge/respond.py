"""Answering a generation from its stream of entries: SSE chunks, or one JSON object."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from bridge.demux import ResponseStream
from bridge.errors import EdgeError, from_code
from bridge.metrics import BridgeMetrics
from bridge.render import ChatRenderer, TextRenderer
from bridge.render_responses import ResponsesRenderer
from bridge.sse import DONE, error_event
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, Finished, StreamError
from schemas.requests import GenerateRequest

log = logging.getLogger("laneway.bridge")

Render = ChatRenderer | TextRenderer | ResponsesRenderer


class _EventStream(web.StreamResponse):
    # The headers wait for the first chunk and leave in the same write (aiohttp's own
    # `web.Response` does this): one syscall fewer per streamed answer.
    _send_headers_immediately = False


class _SlowReader(Exception):
    """A write waited past its timeout: the client's socket is full and it is not reading."""


class _Writer:
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
            raise _SlowReader from None


async def stream_sse(request: web.Request, stream: ResponseStream, generate: GenerateRequest, render: Render,
                     entries: list[Entry], started: float, metrics: BridgeMetrics,
                     headers: dict[str, str], write_timeout_s: float) -> web.StreamResponse:
    """Server-sent events; errors after the first byte go in-band, then [DONE] (the Responses API:
    `response.failed`, and no [DONE])."""
    response = _EventStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                     "X-Accel-Buffering": "no", **headers})
    try:
        await response.prepare(request)
        await _write_stream(_Writer(response, write_timeout_s), stream, generate, render, entries, started,
                            metrics)
    except ConnectionResetError:
        log.debug("client left mid-stream: %s", generate.request_id)  # the caller cancels
    except _SlowReader:
        # Nothing more can reach this client: drop the connection and what it buffers. The
        # caller cancels the generation (the stream did not end).
        log.info("client stopped reading for %g s; stream ended: %s", write_timeout_s, generate.request_id)
        metrics.slow_readers.labels("write_timeout").inc()
        if request.transport is not None:
            request.transport.abort()
    return response


def _include_usage(generate: GenerateRequest) -> bool:
    options = generate.body.stream_options
    return bool(options and options.include_usage)


async def _write_stream(response: _Writer, stream: ResponseStream, generate: GenerateRequest,
                        render: Render, entries: list[Entry], started: float, metrics: BridgeMetrics) -> None:
    out = [render.start()]
    first_token = True
    tokens = metrics.tokens.labels(generate.klass)
    while True:
        tokens.inc(sum(len(e.token_ids) or 1 for e in entries if isinstance(e, Delta)))  # once per batch
        for entry in entries:
            if isinstance(entry, Delta):
                if first_token:
                    metrics.ttft.labels(generate.klass).observe(time.monotonic() - started)
                    first_token = False
                out.append(render.delta(entry))
            elif isinstance(entry, Finished):
                out.append(render.finish(entry))
                if _include_usage(generate):
                    out.append(render.usage_chunk(entry))
                if not isinstance(render, ResponsesRenderer):
                    out.append(DONE)
                metrics.e2e.labels(generate.klass).observe(time.monotonic() - started)
                await response.write(b"".join(out), eof=True)   # the last chunk and the terminator: one write
                return
            else:  # StreamError after the stream started: in-band, then [DONE]
                err = from_code(entry.code, entry.message)
                out += [render.failed(err)] if isinstance(render, ResponsesRenderer) \
                    else [error_event(err.body()), DONE]
                await response.write(b"".join(out), eof=True)
                return
        await response.write(b"".join(out))
        out.clear()
        try:
            entries = await stream.next_entries()
        except TimeoutError:
            entries = [StreamError(generate.request_id, stream.attempt, stream.next_seq,
                                   ErrorCode.deadline_exceeded.value, "no response before the deadline")]


async def collect_json(stream: ResponseStream, generate: GenerateRequest, render: Render, entries: list[Entry],
                       started: float, metrics: BridgeMetrics, headers: dict[str, str]) -> web.Response:
    """One `chat.completion` (or `text_completion`) object once the stream has finished."""
    body = await collect_body(stream, generate, render, entries, started, metrics)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def collect_body(stream: ResponseStream, generate: GenerateRequest, render: Render, entries: list[Entry],
                       started: float, metrics: BridgeMetrics) -> bytes:
    """The answer's JSON body once the stream has finished; an in-band error raises EdgeError."""
    tokens = 0
    klass = generate.klass
    while True:
        for entry in entries:
            if isinstance(entry, Delta):
                if not tokens:
                    metrics.ttft.labels(klass).observe(time.monotonic() - started)
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
