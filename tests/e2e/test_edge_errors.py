"""Bad input at the edge: each gets the right OpenAI-shaped error and leaves nothing queued."""

from __future__ import annotations

import aiohttp
import pytest

from loadtest.stack import Stack, demo_settings
from tests.wait import eventually

KEY = "sk-test-edge"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY)) as s:
        yield s


@pytest.fixture(scope="module")
async def http(stack):
    async with aiohttp.ClientSession(base_url=stack.url) as session:
        yield session


async def queued(stack) -> int:
    js = stack.broker._nc.jetstream()
    info = await js.stream_info(stack.broker.s.req_stream)
    return info.state.messages


def good(**over) -> dict:
    body = {"model": "laneway-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body.update(over)
    return body


async def call(http, body=None, *, raw: bytes | None = None, key: str | None = KEY, headers=None):
    h = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    async with http.post(
        CHAT, data=raw if raw is not None else None, json=body if raw is None else None, headers=h
    ) as resp:
        return resp.status, await resp.json(), resp.headers


def assert_openai_error(payload: dict, *, param=None) -> dict:
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    "case, body, raw, status, param",
    [
        ("malformed json", None, b'{"model": "laneway-sim", "messages": [', 400, None),
        ("missing messages", {"model": "laneway-sim"}, None, 400, None),
        ("empty messages", good(messages=[]), None, 400, "messages"),
        ("negative max_tokens", good(max_tokens=-5), None, 400, "max_tokens"),
        ("huge max_tokens", good(max_tokens=10**9), None, 400, "max_tokens"),
        ("bad role", good(messages=[{"role": "wizard", "content": "x"}]), None, 400, "messages[0].role"),
        ("n over the choices limit", good(n=9), None, 400, "n"),
        ("temperature out of range", good(temperature=7), None, 400, "temperature"),
        ("penalty out of range", good(presence_penalty=3.0), None, 400, "presence_penalty"),
        (
            "image content part",
            good(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            None,
            400,
            "messages[0].content",
        ),
        ("unknown model", good(model="gpt-17"), None, 404, "model"),
    ],
)
async def test_bad_requests_get_openai_errors(stack, http, case, body, raw, status, param):
    before = await queued(stack)
    got, payload, _ = await call(http, body, raw=raw)
    assert got == status, (case, payload)
    err = assert_openai_error(payload, param=param)
    assert err["type"] == "invalid_request_error"
    assert await queued(stack) == before


async def test_missing_and_wrong_keys_are_401(http):
    for key in (None, "sk-wrong"):
        status, payload, _ = await call(http, good(), key=key)
        assert status == 401
        assert assert_openai_error(payload)["type"] == "authentication_error"


async def test_unknown_and_forbidden_class(http):
    status, payload, _ = await call(http, good(), headers={"x-laneway-class": "vip"})
    assert status == 400 and assert_openai_error(payload)["param"] == "x-laneway-class"


async def test_body_over_nats_max_payload_is_413(stack, http):
    before = await queued(stack)
    big = "x" * (stack.bridge._nc.max_payload + 1000)
    status, payload, _ = await call(http, good(messages=[{"role": "user", "content": big}]))
    assert status == 413
    assert_openai_error(payload)
    assert await queued(stack) == before


async def test_body_over_http_limit_is_413(http):
    status, payload, _ = await call(http, raw=b"x" * (5 * 1024 * 1024))
    assert status == 413
    assert_openai_error(payload)


async def test_unknown_route_is_openai_shaped_404(http):
    async with http.get("/v1/nope") as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json())


async def test_expired_deadline_is_504_and_nothing_left(stack, http):
    before = await queued(stack)
    status, payload, _ = await call(http, good(), headers={"x-laneway-timeout": "0.000001"})
    assert status == 504
    assert assert_openai_error(payload)["code"] == "deadline_exceeded"

    # The broker terminates the message and tells the client on one connection, but JetStream
    # applies the +TERM asynchronously: wait for it rather than race it.
    async def terminated() -> bool:
        return await queued(stack) == before

    assert await eventually(terminated), "the expired request was never terminated"


async def test_health_ready_metrics(http):
    async with http.get("/healthz") as resp:
        assert resp.status == 200
    async with http.get("/readyz") as resp:
        assert resp.status == 200 and (await resp.json())["pools"] == {"sim": 1}
    async with http.get("/metrics") as resp:
        text = await resp.text()
        assert "laneway_http_requests_total" in text and "laneway_ttft_seconds" in text
