"""Poison requests end in the DLQ with their reason; malformed messages never stop the broker;
a full system answers 503 while health and metrics stay responsive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import nats
import pytest

from bridge.client import LanewayClient, LanewayError
from core.topology import StreamLimits
from loadtest.stack import Stack, demo_settings
from schemas import codec
from schemas.work import Credit
from tests.requests import chat
from tests.wait import eventually
from workers.engine import EngineError, EngineOutput, EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY = "sk-faults"


class PoisonableEngine(SimEngine):
    """The sim engine, except that any prompt containing POISON fails inside the engine."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if any("POISON" in t for t in request.body.texts()):
            raise EngineError(request.request_id, "the model crashed on this input")
        async for out in super().generate(request):
            yield out


async def dlq_messages(nc, stream: str) -> list:
    js = nc.jetstream()
    sub = await js.pull_subscribe(">", stream=stream)
    try:
        return await sub.fetch(100, timeout=1)
    except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either when time runs out
        return []
    finally:
        await sub.unsubscribe()


async def stored(nc, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def stored_is(nc, stream: str, count: int) -> bool:
    return await stored(nc, stream) == count


@pytest.fixture(scope="module")
async def stack(nats_server):
    limits = StreamLimits(max_deliver=3, ack_wait_s=2.0)
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[PoisonableEngine(PROFILES["zero"])],
        limits=limits,
        prefix="poison",
    ) as s:
        yield s


@pytest.fixture(scope="module")
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()


async def test_poison_request_stops_after_max_deliver_and_lands_in_the_dlq(stack, nc):
    async with LanewayClient(nc, "demo", prefix="poison") as client:
        with pytest.raises(LanewayError) as err:
            async for _ in client.generate(chat("POISON pill", max_tokens=256)):
                pass
        assert err.value.code == "engine_error" and "3 attempts" in err.value.message
        dead = await dlq_messages(nc, "POISON_DLQ")
        assert len(dead) == 1
        assert dead[0].headers["Laneway-Reason"] == "engine_error"
        assert dead[0].headers["Laneway-Attempt"] == "3"
        assert codec.decode_request(dead[0].data).request_id == err.value.request_id
        assert await stored(nc, "POISON_REQ") == 0
        # ... and the broker keeps serving.
        text = "".join([t async for t in client.generate(chat("ok", max_tokens=3))])
        assert len(text.split()) == 3


async def test_malformed_message_is_dead_lettered_and_service_continues(stack, nc):
    js = nc.jetstream()
    before = len(await dlq_messages(nc, "POISON_DLQ"))
    await js.publish("poison.req.interactive.demo", b"\x93not a request")
    assert await eventually(lambda: stored_is(nc, "POISON_DLQ", before + 1)), "never dead-lettered"
    assert await eventually(lambda: stored_is(nc, "POISON_REQ", 0)), "never removed from the queue"
    dead = await dlq_messages(nc, "POISON_DLQ")
    assert len(dead) == before + 1
    assert dead[-1].headers["Laneway-Reason"] == "malformed"
    assert await stored(nc, "POISON_REQ") == 0
    async with LanewayClient(nc, "demo", prefix="poison") as client:
        parts = [t async for t in client.generate(chat("ok", max_tokens=2))]
        assert parts


async def test_a_request_whose_workers_keep_dying_is_dead_lettered(nats_server, nc):
    """A 'worker' takes the dispatch and vanishes without a word, every time: after max_deliver
    deliveries JetStream gives up, and the broker moves the request to the DLQ and tells the client."""
    limits = StreamLimits(max_deliver=2, ack_wait_s=1.0)
    async with Stack(nats_server.url, demo_settings(KEY), engines=[], limits=limits, prefix="crash"):
        async with LanewayClient(nc, "demo", prefix="crash") as client:

            async def consume():
                async for _ in client.generate(chat("hi", max_tokens=256)):
                    pass

            task = asyncio.create_task(consume())
            credit = codec.encode(
                Credit(worker_id="doomed", pool="sim", free_slots=1, token_budget=10**6, total_slots=1, wait_s=1.0)
            )
            taken = 0
            deadline = time.monotonic() + 15
            while taken < 2 and time.monotonic() < deadline:
                reply = await nc.request("crash.pull.sim", credit, timeout=5)
                taken += len(codec.decode_batch(reply.data).dispatches)  # ... and never acked
            assert taken == 2
            with pytest.raises(LanewayError) as err:
                await asyncio.wait_for(task, 15)
            assert err.value.code == "engine_error"
        dead = await dlq_messages(nc, "CRASH_DLQ")
        assert [m.headers["Laneway-Reason"] for m in dead] == ["max_deliver"]
        assert await stored(nc, "CRASH_REQ") == 0


async def test_full_system_gives_503_and_stays_responsive(nats_server):
    engine = SimEngine(PROFILES["llama-8b-h100"], max_seqs=2)
    limits = StreamLimits(max_msgs=6)
    async with Stack(nats_server.url, demo_settings(KEY), engines=[engine], limits=limits, prefix="full") as s:
        body = {"model": "laneway-sim", "max_tokens": 400, "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession(base_url=s.url) as http:

            async def one():
                async with http.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
                ) as resp:
                    return resp.status, resp.headers.get("Retry-After"), await resp.json()

            tasks = [asyncio.create_task(one()) for _ in range(12)]
            assert await eventually(lambda: engine.num_running() == 2), "the system never filled up"
            started = time.monotonic()
            for path in ("/healthz", "/metrics"):
                async with http.get(path) as resp:
                    assert resp.status == 200
            assert time.monotonic() - started < 1.0, "health and metrics must answer while overloaded"
            results = await asyncio.gather(*tasks)
    statuses = [r[0] for r in results]
    assert statuses.count(200) == 6 and statuses.count(503) == 6
    for status, retry_after, payload in results:
        if status == 503:
            assert retry_after and payload["error"]["type"] == "server_error"
