"""Local OpenAI-shaped HTTP servers for the peer benchmark (`loadtest/peer.py`), each run as its
own process so its CPU is nobody's overhead:

    python -m loadtest.mock_upstream serve --port P [--tokens 64]
        a mock upstream: streams `min(tokens, max_tokens)` content chunks for any chat request,
        then the usage chunk when asked for, then [DONE]. No model, no delays: every millisecond
        a client sees beyond this server's is the proxy's in between.
    python -m loadtest.mock_upstream relay --port P --upstream http://127.0.0.1:Q
        the floor: one aiohttp process that forwards the request's bytes and copies the
        upstream's bytes back as they arrive, with no parsing at all.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal

import aiohttp
import orjson
from aiohttp import web

MODEL = "mock"
_ids = itertools.count()


def _chunk(rid: str, delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    doc = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _prompt_tokens(body: dict) -> int:
    # ~4 characters per token, as the sim and the broker estimate.
    return sum(len(m.get("content") or "") for m in body.get("messages", []) if isinstance(m, dict)) // 4


async def _chat(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or request.app["tokens"]
    count = min(int(limit), request.app["tokens"])
    rid = f"chatcmpl-mock-{next(_ids)}"
    if not body.get("stream"):
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "tok " * count}}
                ],
                "usage": {
                    "prompt_tokens": _prompt_tokens(body),
                    "completion_tokens": count,
                    "total_tokens": _prompt_tokens(body) + count,
                },
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(_chunk(rid, {"role": "assistant", "content": ""}))
    token = _chunk(rid, {"content": "tok "})
    for _ in range(count - 1):
        await resp.write(token)
    await resp.write(_chunk(rid, {"content": "tok "}, "length"))
    if (body.get("stream_options") or {}).get("include_usage"):
        prompt = _prompt_tokens(body)
        await resp.write(
            _chunk(
                rid, None, usage={"prompt_tokens": prompt, "completion_tokens": count, "total_tokens": prompt + count}
            )
        )
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "mock"}]})


def mock_app(tokens: int) -> web.Application:
    app = web.Application(client_max_size=16 << 20)
    app["tokens"] = tokens
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    return app


async def _relay(request: web.Request) -> web.StreamResponse:
    session: aiohttp.ClientSession = request.app["session"]
    headers = {"Content-Type": "application/json"}
    async with session.post(
        request.app["upstream"] + request.path, data=await request.read(), headers=headers
    ) as upstream:
        resp = web.StreamResponse(
            status=upstream.status, headers={"Content-Type": upstream.headers.get("Content-Type", "")}
        )
        await resp.prepare(request)
        async for data in upstream.content.iter_any():
            await resp.write(data)
        await resp.write_eof()
        return resp


def relay_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=16 << 20)
    app["upstream"] = upstream.rstrip("/")

    async def session(app: web.Application):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app["session"].close()

    app.cleanup_ctx.append(session)
    app.router.add_post("/v1/chat/completions", _relay)
    return app


async def _serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="the mock upstream")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=64, help="content chunks per answer at most")
    p = sub.add_parser("relay", help="the one-process pass-through floor")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    args = parser.parse_args()
    app = mock_app(args.tokens) if args.command == "serve" else relay_app(args.upstream)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(app, args.port))
    else:
        uvloop.run(_serve(app, args.port))


if __name__ == "__main__":
    main()
