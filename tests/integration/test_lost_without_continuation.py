"""A worker whose engine cannot continue a stream (a hosted API: `Engine.continues` is false) says so in its heartbeat, and when it is lost mid-stream the bridge ends the stream
with `worker_lost` as soon as it finds the worker silent, instead of holding the client for a
continuation that cannot come. The wait for one is set to an hour here, and the class's wait in
the lanes is 300 s: a stream that waited for either would outlive the test."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from bridge.config import BridgeConfig
from bridge.streams import losses
from core.topology import StreamLimits
from loadtest.http_client import Result, stream_chat
from loadtest.stack import Stack, demo_settings
from tests.deaths import LONG_STREAM, die_without_a_word
from tests.wait import eventually
from workers.config import WorkerConfig
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

pytestmark = pytest.mark.timeout(180)

KEY = "sk-lost"


class Unresumable(SimEngine):
    continues = False


async def test_a_stream_on_an_engine_that_cannot_continue_ends_when_its_worker_is_lost(nats_server, monkeypatch):
    monkeypatch.setattr(losses, "CONTINUE_MARGIN_S", 3600.0)
    engine = Unresumable(PROFILES["llama-8b-h100"], speed=0.05)
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[engine],
        worker_config=WorkerConfig(heartbeat_s=0.5),
        bridge_config=replace(BridgeConfig(), worker_stale_s=2.0),
    ) as stack:
        [worker] = stack.workers
        assert await eventually(lambda: any(not b.continues for b in stack.bridge.readiness.workers()))
        result = Result()
        async with aiohttp.ClientSession() as http:
            # Class `standard`: its redelivery, with no worker left, would wait 300 s in the lanes.
            headers = {"x-laneway-class": "standard"}
            task = asyncio.create_task(stream_chat(http, stack.url, KEY, LONG_STREAM, headers, result=result))
            assert await eventually(lambda: result.tokens > 0 or task.done(), timeout=60) and not task.done()
            await die_without_a_word(worker)
            await asyncio.wait_for(task, timeout=120)
        assert result.error == "worker_lost", (result.error, result.finish_reason, result.tokens)


async def test_a_lost_stream_waits_for_its_continuation_as_long_as_the_brokers_ack_wait(nats_server):
    """When no scheduler saw the death, the redelivery comes after the consumer's ack_wait: the
    bridge waits that long (as the brokers' beats say it), not a fixed 35 s, before `worker_lost`."""
    async with Stack(nats_server.url, demo_settings(KEY), engines=[], limits=StreamLimits(ack_wait_s=75.0)) as stack:
        assert await eventually(lambda: stack.bridge.readiness.redelivery_within() == 75.0)
