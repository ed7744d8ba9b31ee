"""A real OpenAI-compatible HTTP server for the `openai` engine to run against: aiohttp on port 0,
answering `/v1/chat/completions` and `/v1/completions` from a `SimEngine`, streamed as OpenAI
streams them (content deltas, a finish chunk, a usage chunk with `prompt_tokens_details`).

So the `openai` engine's conformance rests on a server that behaves: it stops at `max_tokens`,
counts usage and prefix-cache hits, refuses what its engine refuses with OpenAI's 400 naming the
parameter, and stops generating when its client goes away (the handler is cancelled, which
closes the sim's stream and frees its slot: `idle()` sees it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from aiohttp import web

from schemas.codec import decode_chat_request, decode_completion_request
from workers.engine import EngineOutput, EngineRequest, UnsupportedRequest
from workers.engines.sim.engine import SimEngine


class SimUpstream:
    def __init__(self, sim: SimEngine) -> None:
        self.sim = sim
        self.url = ""
        self._ids = itertools.count()  # its own ids: the engine sends the same bare id for two tenants
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        await self.sim.start()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        # Cancel a handler whose client went away, as a serving stack does: its sim stream closes.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.sim.cleanup()

    def idle(self) -> bool:
        return self.sim.num_running() == 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        try:
            body, extra = decode_chat_request(raw) if chat else decode_completion_request(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            return _error(400, str(e), None)
        rid = f"up-{next(self._ids)}"
        stream = self.sim.generate(EngineRequest(rid, body, extra=extra))
        async with contextlib.aclosing(stream):
            try:
                first = await anext(stream)  # the sim refuses before it generates
            except UnsupportedRequest as e:
                return _error(400, e.message, e.param)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for out in _chain(first, stream):
                for event in _events(rid, out, chat=chat):
                    await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response


async def _chain(first: EngineOutput, rest: AsyncIterator[EngineOutput]) -> AsyncIterator[EngineOutput]:
    yield first
    async for out in rest:
        yield out


def _events(rid: str, out: EngineOutput, *, chat: bool) -> list[dict[str, Any]]:
    def chunk(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        return {"id": rid, "object": kind, "created": 1, "model": "sim", "choices": choices, **more}

    if out.finish_reason is None:
        piece = {"delta": {"content": out.text}} if chat else {"text": out.text}
        return [chunk([{"index": out.index, "finish_reason": None, **piece}])]
    reasons = out.finish_reasons or [out.finish_reason]
    empty = {"delta": {}} if chat else {"text": ""}
    usage = {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
    }
    finishes = [chunk([{"index": i, "finish_reason": r, **empty}]) for i, r in enumerate(reasons)]
    if out.text:
        finishes.insert(
            0,
            chunk(
                [
                    {
                        "index": out.index,
                        "finish_reason": None,
                        **({"delta": {"content": out.text}} if chat else {"text": out.text}),
                    }
                ]
            ),
        )
    return [*finishes, chunk([], usage=usage)]


def _error(status: int, message: str, param: str | None) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return web.json_response({"error": error}, status=status)
