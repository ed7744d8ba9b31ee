"""The lane's behaviours on a real nats-server: cancel frees the slot, deadlines abort, backlog
caps give 429, one frame per step per inbox, priority under a batch flood, the NATS client."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import nats
import pytest

from bridge.client import LanewayClient, LanewayError
from bridge.config import BridgeConfig
from core.topology import StreamLimits
from loadtest.stack import Stack, demo_settings
from tests.requests import chat
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import WorkerConfig

KEY = "sk-lanes"
CHAT = "/v1/chat/completions"


def body(max_tokens: int, stream: bool = True, content: str = "hello") -> dict:
    return {
        "model": "laneway-sim",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    }


def headers(**extra: str) -> dict:
    return {"Authorization": f"Bearer {KEY}", **extra}


async def stored(stack) -> int:
    info = await stack.broker._nc.jetstream().stream_info(stack.broker.s.req_stream)
    return info.state.messages


async def stored_none(stack) -> bool:
    return await stored(stack) == 0


def four_slots(nats_server, prefix: str) -> Stack:
    """One worker with a modelled 8B GPU (~7 ms per decode step) and only 4 slots."""
    engine = SimEngine(PROFILES["llama-8b-h100"], max_seqs=4)
    # A client that leaves may resume for --resume-window-s; a short one, so its cancel lands soon.
    return Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[engine],
        prefix=prefix,
        limits=StreamLimits(max_msgs_per_subject=6),
        bridge_config=BridgeConfig(resume_window_s=0.5),
    )


@pytest.fixture(scope="module")
async def slow_stack(nats_server):
    async with four_slots(nats_server, "slow") as s:
        yield s


async def test_client_disconnect_cancels_and_frees_the_slot(slow_stack):
    engine: SimEngine = slow_stack.workers[0].engine
    async with aiohttp.ClientSession(base_url=slow_stack.url) as http:
        async with http.post(CHAT, json=body(5000), headers=headers()) as resp:
            assert resp.status == 200
            await resp.content.readline()
            await resp.content.readline()
            assert engine.num_running() == 1
        # The connection is closed here, mid-stream.
    assert await eventually(lambda: engine.num_running() == 0), "the engine slot was not freed"
    assert await eventually(lambda: stored_none(slow_stack)), "the cancelled request was not acked"


async def test_deadline_mid_generation_ends_with_in_band_error(slow_stack):
    engine: SimEngine = slow_stack.workers[0].engine
    async with aiohttp.ClientSession(base_url=slow_stack.url) as http:
        async with http.post(CHAT, json=body(5000), headers=headers(**{"x-laneway-timeout": "3"})) as resp:
            assert resp.status == 200
            text = await resp.text()
    events = [line for line in text.split("\n\n") if line]
    assert '"deadline_exceeded"' in events[-2] and events[-1] == "data: [DONE]"
    assert await eventually(lambda: engine.num_running() == 0)


async def test_backlog_cap_gives_429_with_retry_after(slow_stack):
    async with aiohttp.ClientSession(base_url=slow_stack.url) as http:

        async def one():
            async with http.post(CHAT, json=body(300, stream=False), headers=headers()) as resp:
                return resp.status, resp.headers.get("Retry-After"), await resp.json()

        results = await asyncio.gather(*(one() for _ in range(12)))
    statuses = [r[0] for r in results]
    assert statuses.count(200) >= 6 and 429 in statuses
    for status, retry_after, payload in results:
        if status == 429:
            assert retry_after is not None
            assert payload["error"]["type"] == "rate_limit_error"


async def test_interactive_is_served_ahead_of_a_batch_flood(nats_server):
    """4 slots, batch may hold 90% of them (3): a chat arriving behind 6 long batch jobs starts
    at once on the headroom slot instead of waiting for a batch job to finish. A stack of its
    own: where chats filled the worker lately (the module's other tests), batch leaves their
    burst free too and holds 1 (broker/headroom.py)."""
    async with four_slots(nats_server, "flooded") as stack, aiohttp.ClientSession(base_url=stack.url) as http:

        async def batch_job():
            async with http.post(
                CHAT, json=body(400, stream=False), headers=headers(**{"x-laneway-class": "batch"})
            ) as resp:
                return resp.status

        flood = [asyncio.create_task(batch_job()) for _ in range(6)]
        engine: SimEngine = stack.workers[0].engine
        ok = await eventually(lambda: engine.num_running() == 3, 5.0)
        assert ok, (engine.num_running(), engine.capacity(), [t.done() and t.result() for t in flood])
        started = time.monotonic()
        async with http.post(CHAT, json=body(4), headers=headers()) as resp:
            await resp.content.readline()
            await resp.content.readline()
            ttft = time.monotonic() - started
            await resp.read()
        still_running = [t for t in flood if not t.done()]
        assert still_running, "the chat waited for the batch flood to drain"
        assert ttft < 2.0  # one batch job takes ~3 s; generous bound, not a speed assertion
        assert all(s == 200 for s in await asyncio.gather(*flood))


async def test_one_frame_per_engine_step_per_inbox(nats_server):
    engine = SimEngine(PROFILES["llama-8b-h100"], speed=4.0)
    # Every request accepted: on a loaded machine (pytest -n 3) the bridge's measured stream limit
    # and delivery-lag door turned some of the 32 away with a 503 (their own tests); this one
    # counts frames per engine step.
    doors_open = BridgeConfig(initial_stream_limit=0, max_delivery_lag_s=0)
    async with Stack(
        nats_server.url, demo_settings(KEY), engines=[engine], prefix="frames", bridge_config=doors_open
    ) as s:
        worker = s.workers[0]
        frames = worker.metrics.frames.labels("sim")
        before_frames, before_steps = frames._value.get(), engine.steps
        async with aiohttp.ClientSession(base_url=s.url) as http:

            async def one():
                async with http.post(CHAT, json=body(50, stream=False), headers=headers()) as resp:
                    assert resp.status == 200

            await asyncio.gather(*(one() for _ in range(32)))
        published = frames._value.get() - before_frames
        steps = engine.steps - before_steps
        # 32 streams × 51 entries each would be 1,632 messages one-per-token; frames ride steps.
        assert published <= steps + 2, (published, steps)


async def test_nats_client_streams_and_reports_errors(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY), prefix="direct") as s:
        nc = await nats.connect(nats_server.url)
        try:
            async with LanewayClient(nc, tenant="demo", prefix="direct") as client:
                parts = [t async for t in client.generate(chat("hi", max_tokens=7))]
                assert len("".join(parts).split()) == 7
                assert client.last_usage.completion_tokens == 7
                with pytest.raises(LanewayError) as err:
                    async for _ in client.generate(chat("hi", model="no-such-model", max_tokens=256)):
                        pass
                assert err.value.code == "unknown_model"
        finally:
            await nc.close()
        assert s.url


async def test_a_capped_class_is_served_when_room_frees_not_when_the_pull_times_out(nats_server):
    """4 slots; `standard` may hold 3. A 4th standard request waits for a slot. When one frees,
    the worker's fresh credit replaces its parked pull: the request starts then, not after the
    30 s the stale pull would have been held."""
    engine = SimEngine(PROFILES["llama-8b-h100"], max_seqs=4)
    config = WorkerConfig(pull_wait_s=30.0)
    async with Stack(nats_server.url, demo_settings(KEY), engines=[engine], prefix="repull", worker_config=config) as s:
        async with aiohttp.ClientSession(base_url=s.url) as http:

            async def one():
                async with http.post(
                    CHAT, json=body(100, stream=False), headers=headers(**{"x-laneway-class": "standard"})
                ) as resp:
                    return resp.status

            started = time.monotonic()
            statuses = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(4))), 60)
            elapsed = time.monotonic() - started
        assert statuses == [200] * 4
        assert elapsed < 15, f"the 4th request waited for the parked pull to time out ({elapsed:.1f} s)"
