"""The HTTP side of resumable streams (`--resume-window-s`, bridge/resume/window.py).

A streamed chat or completion sent with `x-laneway-resumable: true` is answered with numbered
events (bridge/resume/replay.py); without it, the stream is as before (no ids; the generation is
cancelled the moment its client leaves). A client cut
off re-POSTs to the same endpoint with `Last-Event-ID: <id>` and the same API key: the body is
not read (the id names the stream), nothing is generated again, and the answer is the events
after that id, then the live rest, then `[DONE]`. A resume that reaches another replica than the
one holding the stream is relayed from it over NATS (bridge/resume/relay.py).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from bridge.errors import EdgeError
from bridge.metrics import BridgeMetrics
from bridge.render.respond import Render, Writer, serve_sse
from bridge.resume.relay import RelayClient
from bridge.resume.replay import LAST_EVENT_ID, UNKNOWN, BadEventId, EventId, Replay, follow, resume_error
from bridge.resume.window import Resumes
from bridge.streams.demux import ResponseStream
from schemas.errors import ErrorCode
from schemas.frames import Entry
from schemas.requests import GenerateRequest

RESUMABLE_PATHS = ("/v1/chat/completions", "/v1/completions")
# Asked for per request: `id:` lines in an SSE stream are valid, but clients that read it line by
# line as `data: ...` (vLLM's benchmark client, many hand-written ones) break on them, and a
# stream nobody will resume should stop when its client leaves, not a window later.
RESUMABLE_HEADER = "x-laneway-resumable"


def abort_of(request: web.Request) -> Callable[[], None]:
    """Drop the connection: a resume has taken the stream over from it."""

    def abort() -> None:
        if request.transport is not None:
            request.transport.abort()

    return abort


class ResumableStreams:
    def __init__(self, resumes: Resumes, relay: RelayClient, metrics: BridgeMetrics, write_timeout_s: float) -> None:
        self.resumes = resumes
        self.relay = relay
        self.metrics = metrics
        self.write_timeout_s = write_timeout_s

    @property
    def enabled(self) -> bool:
        return self.resumes.enabled

    def covers(self, request: web.Request) -> bool:
        """Streamed chats and text completions are resumable when the client asks
        (`x-laneway-resumable: true`); the Responses API numbers its own events; embeddings
        never stream."""
        return (
            self.enabled
            and request.path in RESUMABLE_PATHS
            and request.headers.get(RESUMABLE_HEADER, "").lower() in ("true", "1")
        )

    def asked(self, request: web.Request) -> bool:
        return LAST_EVENT_ID in request.headers and self.enabled and request.path in RESUMABLE_PATHS

    async def stream(
        self,
        request: web.Request,
        stream: ResponseStream,
        generate: GenerateRequest,
        render: Render,
        entries: list[Entry],
        started: float,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        """Answer a new streamed request; from here the stream is held (and its generation
        cancelled, if need be) by `Resumes`, not by the route."""
        replay, token = self.resumes.open(generate, request.path, stream, render, started)
        replay.add(entries)
        replay.abort = abort_of(request)
        return await self.serve(request, replay, token, -1, headers)

    async def resume(
        self, request: web.Request, tenant: str, headers_for: Callable[[str], dict[str, str]]
    ) -> web.StreamResponse:
        try:
            event = EventId.parse(request.headers[LAST_EVENT_ID])
        except BadEventId as exc:
            raise EdgeError(ErrorCode.invalid_request, str(exc), LAST_EVENT_ID) from None
        headers = headers_for(event.request_id)
        if event.edge_id != self.resumes.edge_id:
            return await self.relay.resume(request, tenant, event, headers)
        replay = self.resumes.find(tenant, event.request_id, request.path)
        if replay is None:
            raise resume_error(UNKNOWN)
        if (problem := replay.problem(event.n)) is not None:
            raise resume_error(*problem)
        token = object()
        self.resumes.take(replay, token, abort_of(request), "local")
        return await self.serve(request, replay, token, event.n, headers)

    async def serve(
        self, request: web.Request, replay: Replay, token: object, after: int, headers: dict[str, str]
    ) -> web.StreamResponse:
        completed = False

        async def write(writer: Writer) -> None:
            nonlocal completed
            completed = await follow(replay, token, lambda events, _: writer.write(b"".join(events)), after)
            if completed:
                await writer.write(b"", eof=True)

        try:
            return await serve_sse(request, headers, replay.request_id, self.metrics, self.write_timeout_s, write)
        finally:
            await self.resumes.release(replay, token, completed)
