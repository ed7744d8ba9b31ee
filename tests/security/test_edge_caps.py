"""One tenant cannot take the bridge from the others: its open streams and what its slow readers
hold are capped, and a client that stops reading is cut off.

Before issue 20 a tenant could open streams until the bridge's own cap (none by default), and a
client that sent a streamed request and never read let the bridge buffer its whole answer: the
kernel grew the socket's send buffer to 4 MiB, then the stream's queue in `bridge/streams/demux.py`
grew without bound while the SSE write waited with no timeout, and the generation ran to its
end. Now the stream cap answers 429 before the request is stored, a stalled stream ends with
`slow_reader` (or its connection is dropped after `--write-timeout`), and its generation is
cancelled on the worker.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
from contextlib import AsyncExitStack, closing

import aiohttp
import pytest

from core.promtext import parse
from loadtest.processes import LanewayUp, metrics_port
from tests.security.conftest import KEYS, write_settings
from tests.wait import eventually

pytestmark = pytest.mark.timeout(300)

TENANT_STREAMS = 2
MAX_TOKENS = 8000  # minutes of simulated decoding: only a cancel ends it early
CHAT = "/v1/chat/completions"


def chat(max_tokens: int = MAX_TOKENS) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Tell me everything."}],
    }


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


async def metric(http: aiohttp.ClientSession, port: int, name: str, **labels: str) -> float:
    """One series' value (0 when absent), or the sum over a name's series when no label is given."""
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        scraped = parse(await resp.text())
    value = scraped.value(name, **labels) if labels else scraped.total(name)
    return 0.0 if math.isnan(value) else value


async def stalled_client(port: int, tenant: str) -> socket.socket:
    """A streamed request whose client never reads: a small receive buffer, and nothing read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    body = json.dumps(chat()).encode()
    sock.sendall(
        f"POST {CHAT} HTTP/1.1\r\nHost: laneway\r\nAuthorization: Bearer {KEYS[tenant]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


async def read_all(sock: socket.socket) -> bytes:
    """What the bridge sent, read to the connection's end (closed, or reset)."""
    sock.setblocking(False)
    loop, data = asyncio.get_running_loop(), b""
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 60):
            data += chunk
    except ConnectionResetError:
        pass
    return data


async def worker_cancelled(http: aiohttp.ClientSession, up: LanewayUp) -> None:
    """The generation stopped on the worker before its end: no slot in use, fewer tokens than asked."""
    [worker] = up.role_pids("worker")
    port = metrics_port(worker)
    assert await eventually(lambda: _idle(http, port), timeout=120)
    assert await metric(http, port, "laneway_worker_tokens_total") < MAX_TOKENS


async def _idle(http: aiohttp.ClientSession, port: int) -> bool:
    return await metric(http, port, "laneway_worker_slots_in_use") == 0


async def bridge_holds_no_stream(http: aiohttp.ClientSession, up: LanewayUp) -> bool:
    return await metric(http, up.port, "laneway_open_streams") == 0


@pytest.fixture(scope="module")
async def capped(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge-caps")
    flags = [
        "--settings",
        str(write_settings(root)),
        "--pii",
        "off",
        "--metrics",
        "--tenant-max-streams",
        str(TENANT_STREAMS),
        "--stream-buffer-bytes",
        "32768",
        "--write-timeout",
        "0",
        # A stream its client left stays resumable, and counts against the cap, this long.
        "--resume-window-s",
        "1",
    ]
    async with LanewayUp(root / "lw", KEYS["acme"], flags) as stack:
        yield stack


async def stored(up: LanewayUp) -> int:
    """The request stream's last sequence, read as the operator."""
    nc = await up.connect_nats("ops")
    try:
        return (await nc.jetstream().stream_info("LW_REQ")).state.last_seq
    finally:
        await nc.close()


async def test_one_tenant_past_its_streams_gets_429_and_the_other_is_still_served(capped):
    async with aiohttp.ClientSession(base_url=capped.url) as http, AsyncExitStack() as held:
        for _ in range(TENANT_STREAMS):
            resp = await held.enter_async_context(http.post(CHAT, json=chat(), headers=auth("acme")))
            assert resp.status == 200 and await resp.content.readline()  # open and streaming
        before = await stored(capped)
        async with http.post(CHAT, json=chat(), headers=auth("acme")) as refused:
            assert refused.status == 429, refused.status
            assert refused.headers["x-laneway-overload"] == "tenant_streams" and refused.headers["Retry-After"]
            assert (await refused.json())["error"]["code"] == "rate_limit_exceeded"
        assert await stored(capped) == before, "the refused request was stored"
        async with http.post(CHAT, json=chat(5), headers=auth("globex")) as other:
            assert other.status == 200 and b"[DONE]" in await other.read()


async def test_a_reader_that_stops_is_ended_and_its_generation_cancelled(capped):
    async with aiohttp.ClientSession() as http:
        # The streams the test before left are held for the resume window, under the cap.
        assert await eventually(lambda: bridge_holds_no_stream(http, capped), timeout=60)
        with closing(await stalled_client(capped.port, "acme")) as sock:
            assert await eventually(lambda: _slow_readers(http, capped.port, "stream"), timeout=120)
            sent = await read_all(sock)
        assert b'"code":"slow_reader"' in sent and sent.rstrip().endswith(b"0")  # in-band error, then the end
        assert b'"finish_reason":"length"' not in sent
        assert await eventually(lambda: bridge_holds_no_stream(http, capped), timeout=60)
        await worker_cancelled(http, capped)


async def _slow_readers(http: aiohttp.ClientSession, port: int, limit: str) -> bool:
    return await metric(http, port, "laneway_slow_readers_total", limit=limit) >= 1


async def test_a_write_that_waits_past_the_timeout_drops_the_connection(tmp_path):
    flags = ["--settings", str(write_settings(tmp_path)), "--pii", "off", "--metrics", "--write-timeout", "2"]
    async with LanewayUp(tmp_path / "lw", KEYS["acme"], flags) as up, aiohttp.ClientSession() as http:
        with closing(await stalled_client(up.port, "acme")) as sock:
            assert await eventually(lambda: _slow_readers(http, up.port, "write_timeout"), timeout=120)
            assert await eventually(lambda: bridge_holds_no_stream(http, up), timeout=60)
            await worker_cancelled(http, up)
            sent = await read_all(sock)
        assert b"[DONE]" not in sent  # cut off: a client that stopped reading gets no more
