"""Hostile input at the edge, against a real bridge on a real nats-server: deep JSON, numbers too big
for the wire, prompts too long for the model, oversize headers, slow and too many connections.
Each gets an OpenAI-shaped answer (or a closed connection) and nothing reaches the request stream."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web

from bridge.app import Bridge
from bridge.config import BridgeConfig
from bridge.metrics import BridgeMetrics
from bridge.server import HttpServer
from core.connect import NatsSettings
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack, demo_settings
from schemas.codec import MAX_JSON_DEPTH
from tests.wait import eventually

KEY = "sk-test-limits"
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CLOSE_WITHIN_S = 30.0  # a generous bound on a close that the test waits for, never a sleep


def settings() -> Settings:
    demo = demo_settings(KEY)
    return Settings(
        tenants=demo.tenants, models={**demo.models, "tiny-context": LogicalModel(pool="sim", max_context_tokens=100)}
    )


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, settings()) as s:
        yield s


@pytest.fixture(scope="module")
async def http(stack):
    async with aiohttp.ClientSession(base_url=stack.url) as session:
        yield session


async def stored(stack) -> int:
    """The request stream's last sequence: it moves only when something is stored."""
    info = await stack.broker._nc.jetstream().stream_info(stack.broker.s.req_stream)
    return info.state.last_seq


async def post(http, raw: str | bytes) -> tuple[int, dict]:
    async with http.post(CHAT, data=raw, headers=AUTH) as resp:
        return resp.status, await resp.json()


def openai_error(payload: dict) -> dict:
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def chat(tail: str = "", content: str = '"hi"', model: str = "laneway-sim") -> str:
    """A raw JSON body, so that numbers and nesting reach the bridge exactly as written."""
    message = f'{{"role": "user", "content": {content}}}'
    return f'{{"model": "{model}", "max_tokens": 4, "messages": [{message}]{tail}}}'


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("where", ["content part", "tools", "response_format", "unknown field"])
async def test_deep_json_is_a_400_with_no_traceback(stack, http, caplog, where):
    deep = nested(5000)
    body = {
        "content part": chat(content=f'[{{"type": "text", "text": "x", "extra": {deep}}}]'),
        "tools": chat(f', "tools": [{deep}]'),
        "response_format": chat(f', "response_format": {deep}'),
        "unknown field": chat(f', "metadata": {deep}'),
    }[where]
    before = await stored(stack)
    with caplog.at_level(logging.INFO):
        status, payload = await post(http, body)
    assert status == 400, payload
    err = openai_error(payload)
    assert err["type"] == "invalid_request_error" and str(MAX_JSON_DEPTH) in err["message"]
    assert not [r for r in caplog.records if r.exc_info] and "Traceback" not in caplog.text
    assert await stored(stack) == before


async def test_nesting_within_the_limit_is_decoded(http):
    # Decoded, then refused for what it says, not for its depth.
    status, payload = await post(http, chat(f', "response_format": {nested(MAX_JSON_DEPTH - 1)}'))
    assert status == 400 and openai_error(payload)["param"].startswith("response_format")


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", "1e30"),
        ("seed", str(2**70)),
        ("seed", str(-(2**70))),
        ("max_tokens", "1e30"),
        ("max_tokens", str(2**70)),
        ("max_completion_tokens", str(2**70)),
        ("temperature", "1e400"),
    ],
)
async def test_numbers_out_of_range_name_the_parameter(stack, http, caplog, field, value):
    before = await stored(stack)
    with caplog.at_level(logging.INFO):
        status, payload = await post(http, chat(f', "{field}": {value}'))
    assert status == 400, payload
    assert openai_error(payload)["param"] == field
    assert not [r for r in caplog.records if r.exc_info]
    assert await stored(stack) == before


async def test_the_largest_seed_the_wire_carries_is_served(http):
    status, payload = await post(http, chat(f', "seed": {2**63 - 1}'))
    assert status == 200, payload


async def test_a_prompt_over_the_models_context_is_refused_before_it_is_stored(stack, http):
    before = await stored(stack)
    prompt = json.dumps("word " * 160_000)  # 800 KB: about 200,000 tokens
    status, payload = await post(http, chat(content=prompt))
    assert status == 400, payload
    err = openai_error(payload)
    assert (err["code"], err["param"], err["type"]) == ("context_length_exceeded", "messages", "invalid_request_error")
    status, payload = await post(http, chat(content=json.dumps("x" * 500), model="tiny-context"))
    assert status == 400 and openai_error(payload)["code"] == "context_length_exceeded"
    assert await stored(stack) == before
    status, payload = await post(http, chat(content=json.dumps("x" * 40), model="tiny-context"))
    assert status == 200, payload


async def raw_exchange(url: str, data: bytes) -> bytes:
    """Send raw bytes; everything the server answers until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), CLOSE_WITHIN_S)
    writer.close()
    return answer


def json_body(answer: bytes) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head, answer
    return json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"s" * 10_000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-" + b"s" * 10_000 + b"\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["oversize header", "oversize credential", "not http"],
)
async def test_requests_aiohttp_cannot_parse_get_openai_errors(stack, caplog, request_bytes):
    with caplog.at_level(logging.INFO):
        answer = await raw_exchange(stack.url, request_bytes)
    assert answer.split(b" ", 2)[1] == b"400", answer
    assert openai_error(json_body(answer))["type"] == "invalid_request_error"
    assert b"sss" not in answer  # the offending bytes are not echoed
    assert not [r for r in caplog.records if r.exc_info]


# -- slow and surplus connections: bridges of their own, with limits small enough to meet ---------
@pytest.fixture
async def limited_bridge(stack, request):
    config = BridgeConfig(nats=NatsSettings(url=stack.nats_url), port=0, **request.param)
    async with Bridge(config, settings()) as bridge:
        await bridge.wait_ready()
        yield bridge


async def open_raw(url: str, first: bytes):
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(first)
    await writer.drain()
    return reader, writer


SLOW_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthor"
SLOW_BODY = (
    f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
).encode() + b'{"model": '


@pytest.mark.parametrize("limited_bridge", [{"header_timeout_s": 0.5, "body_timeout_s": 0.5}], indirect=True)
async def test_slow_headers_and_slow_bodies_are_closed(limited_bridge):
    url = limited_bridge.url
    heads = [await open_raw(url, SLOW_HEAD) for _ in range(20)]
    bodies = [await open_raw(url, SLOW_BODY) for _ in range(20)]
    async with aiohttp.ClientSession(base_url=url) as http:
        async with http.get("/healthz") as resp:  # the edge still answers while they hang
            assert resp.status == 200
    for reader, writer in heads:  # closed without an answer
        assert await asyncio.wait_for(reader.read(), CLOSE_WITHIN_S) == b""
        writer.close()
    for reader, writer in bodies:  # 408, then closed
        answer = await asyncio.wait_for(reader.read(), CLOSE_WITHIN_S)
        assert answer.split(b" ", 2)[1] == b"408", answer
        assert openai_error(json_body(answer))["code"] == "request_timeout"
        writer.close()


BOUNDARY = "lwtrickle"
UPLOAD_HEAD = (
    f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: 10000000\r\n\r\n"
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
    "Content-Type: application/octet-stream\r\n\r\n"
).encode()
CHAT_HEAD = SLOW_BODY.replace(b"Content-Length: 1000", b"Content-Length: 10000000")


async def trickle(writer: asyncio.StreamWriter) -> None:
    """One byte at a time, for as long as the bridge takes them."""
    try:
        while True:
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.02)  # scenario, kept: the attacker's pace, not a wait for the bridge
    except (ConnectionError, OSError):
        return


@pytest.mark.parametrize("limited_bridge", [{"header_timeout_s": 5, "body_timeout_s": 0.5}], indirect=True)
@pytest.mark.parametrize("head", [CHAT_HEAD, UPLOAD_HEAD], ids=["chat body", "file upload"])
async def test_a_body_trickled_a_byte_at_a_time_is_cut_at_the_body_timeout(limited_bridge, head):
    """Bytes keep coming, so neither the head's timer nor an idle one ever fires: only a bound on
    the whole body's time closes it. On 0ea08ee an upload had a flat 600 s."""
    reader, writer = await open_raw(limited_bridge.url, head)
    sender = asyncio.create_task(trickle(writer))

    async def until_closed() -> bytes:
        """What the bridge answered, read as it comes: the close after it may be a reset, since
        the trickle was still arriving (unread) when the bridge closed."""
        answer = b""
        try:
            while chunk := await reader.read(1 << 16):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer

    try:
        answer = await asyncio.wait_for(until_closed(), CLOSE_WITHIN_S)
        assert answer.split(b" ", 2)[1] == b"408", answer
        assert openai_error(json_body(answer))["code"] == "request_timeout"
    finally:
        sender.cancel()
        writer.close()


@pytest.mark.parametrize("limited_bridge", [{"max_connections": 3}], indirect=True)
async def test_connections_past_the_cap_are_refused_and_service_resumes(limited_bridge):
    url = limited_bridge.url
    held = [await open_raw(url, b"") for _ in range(3)]
    answer = await raw_exchange(url, b"")
    assert answer.split(b" ", 2)[1] == b"503", answer
    assert openai_error(json_body(answer))["type"] == "server_error"
    for _, writer in held:
        writer.close()

    async def served() -> bool:  # again, once the held connections are gone (the server sees them close)
        try:
            async with aiohttp.ClientSession(base_url=url) as http:
                status, _ = await post(http, chat())
        except aiohttp.ClientError:
            return False
        return status == 200

    assert await eventually(served, CLOSE_WITHIN_S), "never served again after the cap"


async def test_the_header_timeout_never_cuts_a_slow_response():
    """The timer only closes a connection waiting for a request head, never one whose answer is
    still being written (a long SSE stream)."""

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(5):
            await response.write(b"tick\n")
            await asyncio.sleep(0.2)  # scenario, kept: the generation's pace, 1 s in all, against a 0.2 s timeout
        return response

    app = web.Application()
    app.router.add_get("/slow", slow)
    server = HttpServer(app, BridgeMetrics(), header_timeout_s=0.2, max_connections=10)
    port = await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/slow") as resp:
                assert await resp.read() == b"tick\n" * 5
    finally:
        await server.stop()
