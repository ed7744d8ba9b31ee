"""An overloaded bridge refuses new work before anything is stored (503 `overloaded` in the OpenAI
error shape, with Retry-After), and the streams it already accepted run to their end. A real
nats-server, a real bridge with a small stream cap, real HTTP; no timing: the engine holds every
stream after its first token until the test lets it go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from bridge.app import Bridge
from bridge.config import BridgeConfig
from core.connect import NatsSettings
from loadtest.stack import Stack, demo_settings
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, RequestKey
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY = "sk-test-overload"
PREFIX = "over"
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": f"Bearer {KEY}"}
CAP = 2


class HeldEngine(SimEngine):
    """The zero-delay sim, except that a stream whose prompt says HOLD pauses after its first
    output until `release` is set, or the request is aborted (a cancel ends it as on any engine,
    not at the worker's drain timeout)."""

    def __init__(self) -> None:
        super().__init__(PROFILES["zero"])
        self.release = asyncio.Event()
        self._aborted: dict[RequestKey, asyncio.Event] = {}

    async def abort(self, key: RequestKey) -> None:
        if (held := self._aborted.get(key)) is not None:
            held.set()
        await super().abort(key)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        first = any("HOLD" in t for t in request.body.texts())
        aborted = self._aborted[request.key] = asyncio.Event()
        try:
            async for out in super().generate(request):
                yield out
                if first:
                    first = False
                    await self._wait_released(aborted)
        finally:
            self._aborted.pop(request.key, None)

    async def _wait_released(self, aborted: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(self.release.wait()), asyncio.ensure_future(aborted.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


@pytest.fixture(scope="module")
async def engine() -> HeldEngine:
    return HeldEngine()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    async with Stack(nats_server.url, demo_settings(KEY), engines=[engine], prefix=PREFIX) as s:
        yield s


@pytest.fixture
async def capped(stack):
    config = BridgeConfig(nats=NatsSettings(url=stack.nats_url, prefix=PREFIX), port=0, max_streams=CAP)
    async with Bridge(config, demo_settings(KEY)) as bridge:
        await bridge.wait_ready()
        yield bridge


def body(stream: bool) -> dict:
    return {
        "model": "laneway-sim",
        "stream": stream,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "HOLD: tell me a story"}],
    }


async def stored(stack) -> int:
    """The request stream's last sequence: it moves only when a request is stored."""
    info = await stack.broker._nc.jetstream().stream_info(stack.broker.s.req_stream)
    return info.state.last_seq


async def chunks_until_content(resp: aiohttp.ClientResponse) -> list[dict]:
    """SSE chunks up to and including the first with text (the stream is accepted and running)."""
    seen = []
    async for line in resp.content:
        if line.startswith(b"data: {"):
            seen.append(orjson.loads(line[6:]))
            if any(c["delta"].get("content") for c in seen[-1].get("choices", [])):
                return seen
    raise AssertionError(f"the stream ended before its first token: {seen}")


async def rest_of_stream(resp: aiohttp.ClientResponse) -> tuple[list[dict], bool]:
    """The remaining chunks, and whether [DONE] ended them."""
    seen = []
    async for line in resp.content:
        if line.strip() == b"data: [DONE]":
            return seen, True
        if line.startswith(b"data: {"):
            seen.append(orjson.loads(line[6:]))
    return seen, False


async def test_past_the_cap_requests_are_refused_before_storing_and_accepted_streams_finish(stack, capped, engine):
    async with aiohttp.ClientSession(base_url=capped.url) as http:
        accepted = [await http.post(CHAT, json=body(stream=True), headers=AUTH) for _ in range(CAP)]
        try:
            assert [r.status for r in accepted] == [200] * CAP
            for resp in accepted:
                await chunks_until_content(resp)
            before = await stored(stack)

            for stream in (True, False):
                async with http.post(CHAT, json=body(stream), headers=AUTH) as refused:
                    assert refused.status == 503
                    assert int(refused.headers["Retry-After"]) > 0
                    error = (await refused.json())["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "overloaded" and error["type"] == "server_error"
            assert "open streams" in error["message"]
            assert await stored(stack) == before  # refused before anything was stored
            assert capped.metrics.rejected.labels("overloaded")._value.get() == 2

            engine.release.set()
            for resp in accepted:
                rest, done = await rest_of_stream(resp)
                assert done and not any("error" in c for c in rest), rest
                assert [c for c in rest if c.get("choices") and c["choices"][0].get("finish_reason")]
        finally:
            for resp in accepted:
                resp.release()

        assert await eventually(lambda: len(capped.demux) == 0)  # the accepted streams closed
        async with http.post(CHAT, json=body(stream=False), headers=AUTH) as again:
            assert again.status == 200  # the cap frees with them
