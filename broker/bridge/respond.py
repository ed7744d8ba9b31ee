"""Answering a chat completion from its stream of entries: SSE chunks, or one JSON object."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from broker.bridge.errors import EdgeError, from_code
from broker.bridge.sse import DONE, FINISH_REASONS, ChunkRenderer, error_event
from broker.demux import ResponseStream
from broker.metrics import BridgeMetrics
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, Finished, StreamError
from schemas.openai import ChatCompletion, Choice, ChoiceMessage, CompletionUsage
from schemas.requests import GenerateRequest

log = logging.getLogger("laneway.bridge")


class _EventStream(web.StreamResponse):
    # The headers wait for the first chunk and leave in the same write (aiohttp's own
    # `web.Response` does this): one syscall fewer per streamed answer.
    _send_headers_immediately = False


async def stream_sse(request: web.Request, stream: ResponseStream, generate: GenerateRequest,
                     entries: list[Entry], include_usage: bool, started: float,
                     metrics: BridgeMetrics) -> web.StreamResponse:
    """Server-sent events; errors after the first byte go in-band, then [DONE]."""
    response = _EventStream(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        await response.prepare(request)
        await _write_stream(response, stream, generate, entries, include_usage, started, metrics)
    except ConnectionResetError:
        log.debug("client left mid-stream: %s", generate.request_id)  # the caller cancels
    return response


async def _write_stream(response: web.StreamResponse, stream: ResponseStream, generate: GenerateRequest,
                        entries: list[Entry], include_usage: bool, started: float,
                        metrics: BridgeMetrics) -> None:
    render = ChunkRenderer(f"chatcmpl-{generate.request_id}", int(generate.created_at), generate.model)
    out = [render.role()]
    first_token = True
    tokens = metrics.tokens.labels(generate.klass)
    while True:
        tokens.inc(sum(len(e.token_ids) or 1 for e in entries if isinstance(e, Delta)))  # once per batch
        for entry in entries:
            if isinstance(entry, Delta):
                if first_token:
                    metrics.ttft.labels(generate.klass).observe(time.monotonic() - started)
                    first_token = False
                out.append(render.content(entry.text))
            elif isinstance(entry, Finished):
                out.append(render.finish(entry.finish_reason))
                if include_usage:
                    out.append(render.usage(entry.usage.prompt_tokens, entry.usage.completion_tokens))
                out.append(DONE)
                metrics.e2e.labels(generate.klass).observe(time.monotonic() - started)
                await response.write_eof(b"".join(out))   # the last chunk and the terminator: one write
                return
            else:  # StreamError after the stream started: in-band, then [DONE]
                err = from_code(entry.code, entry.message)
                out += [error_event(err.body()), DONE]
                await response.write_eof(b"".join(out))
                return
        await response.write(b"".join(out))
        out.clear()
        try:
            entries = await stream.next_entries()
        except TimeoutError:
            entries = [StreamError(generate.request_id, stream.attempt, stream.next_seq,
                                   ErrorCode.deadline_exceeded.value, "no response before the deadline")]


async def collect_json(stream: ResponseStream, generate: GenerateRequest, entries: list[Entry],
                       started: float, metrics: BridgeMetrics) -> web.Response:
    """One `chat.completion` object once the stream has finished."""
    parts: list[str] = []
    tokens = 0
    klass = generate.klass
    while True:
        for entry in entries:
            if isinstance(entry, Delta):
                if not parts:
                    metrics.ttft.labels(klass).observe(time.monotonic() - started)
                parts.append(entry.text)
                tokens += len(entry.token_ids) or 1
            elif isinstance(entry, Finished):
                usage = CompletionUsage(entry.usage.prompt_tokens, entry.usage.completion_tokens,
                                        entry.usage.prompt_tokens + entry.usage.completion_tokens)
                completion = ChatCompletion(
                    id=f"chatcmpl-{generate.request_id}", created=int(generate.created_at),
                    model=generate.model,
                    choices=[Choice(0, ChoiceMessage("assistant", "".join(parts)),
                                    FINISH_REASONS.get(entry.finish_reason, "stop"))],
                    usage=usage)
                metrics.tokens.labels(klass).inc(tokens)
                metrics.e2e.labels(klass).observe(time.monotonic() - started)
                return web.Response(body=codec.encode_json(completion), content_type="application/json")
            else:
                raise from_code(entry.code, entry.message)
        try:
            entries = await stream.next_entries()
        except TimeoutError:
            raise EdgeError(ErrorCode.deadline_exceeded, "no response before the deadline") from None
