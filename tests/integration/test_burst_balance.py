"""A burst lands within the balance (broker/balance.py, the rule in broker/affinity.py): 60
streams waiting in the lanes go out to two workers' parked pulls not more than BALANCE above the
least loaded (or BALANCE_FLOOR of its slots). Before, the first pull answered took every one its
room allowed: 49 to 11 under `laneway up --workers 2` (issue 36), 59 to 1 here.

The burst is held back by an operator's cap on its class (one slot a worker) until every stream
waits in the lanes and both workers' pulls are parked, then let go by lifting the cap: the moment
a backlog meets a pull, which 60 requests sent at once over HTTP reach only when both workers'
fresh pulls are on their way, as the race goes. Placements are counted in the engines: the
sequences each one holds once all 60 run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import aiohttp
import msgspec
import nats

from bridge.config import BridgeConfig
from broker.affinity import balance_slack
from core.connect import NatsSettings
from core.policy import classes
from core.policy.classes import DEFAULT_CLASSES
from core.provision import provision_at
from core.topology import StreamLimits
from loadtest.http_client import stream_chat
from loadtest.stack import Stack, demo_settings
from schemas.subjects import Subjects
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import WorkerConfig

KEY = "sk-burst"
PREFIX = "burst"
STREAMS = 60
SLOTS = 256
INTERACTIVE = next(c for c in DEFAULT_CLASSES if c.name == "interactive")
ONE_SLOT = msgspec.structs.replace(INTERACTIVE, max_slot_share=1 / SLOTS)


def body(n: int) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": 600,
        "temperature": 0.7,
        "messages": [{"role": "user", "content": f"Question {n}: what is a lane?"}],
    }


async def set_class(url: str, policy) -> None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(Subjects(PREFIX).bucket("classes"))
        await kv.put(policy.name, classes.encode(policy))
    finally:
        await nc.close()


def state(stack: Stack, streams: list[asyncio.Task]) -> tuple:
    """What a failed wait prints: the engines' sequences, the lanes, whether this broker still
    schedules, and how the streams that ended ended."""
    ended = Counter(str(t.result().error) for t in streams if t.done() and not t.cancelled())
    return running(stack), len(stack.broker.scheduler), stack.broker.scheduler.active, dict(ended)


def running(stack: Stack) -> list[int]:
    """The sequences each worker's engine holds."""
    return [cap.total_slots - cap.free_slots for cap in (w.engine.capacity() for w in stack.workers)]


async def test_a_burst_let_go_on_two_parked_pulls_lands_within_the_balance(nats_server, caplog) -> None:
    caplog.set_level(logging.INFO, "laneway.lease")  # a failure says whether the lease came back
    settings = demo_settings(KEY)
    await provision_at(NatsSettings(url=nats_server.url, prefix=PREFIX), StreamLimits(), settings)
    await set_class(nats_server.url, ONE_SLOT)  # kept: provisioning creates only what is absent
    # Slow steps (a fifth of an H100's pace): the streams run for the whole test.
    engines = [SimEngine(PROFILES["llama-8b-h100"], speed=0.2, max_seqs=SLOTS) for _ in range(2)]
    async with Stack(
        nats_server.url,
        settings,
        engines=engines,
        prefix=PREFIX,
        worker_config=WorkerConfig(drain_s=0.5),
        bridge_config=BridgeConfig(initial_stream_limit=0),
    ) as stack:
        assert stack.broker.live.classes["interactive"].max_slot_share == ONE_SLOT.max_slot_share
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            streams = [asyncio.create_task(stream_chat(http, stack.url, KEY, body(n))) for n in range(STREAMS)]
            try:
                scheduler = stack.broker.scheduler
                assert await eventually(
                    lambda: running(stack) == [1, 1] and len(scheduler) == STREAMS - 2, timeout=60
                ), state(stack, streams)
                await set_class(nats_server.url, INTERACTIVE)
                assert await eventually(lambda: sum(running(stack)) == STREAMS, timeout=60), state(stack, streams)
                least, most = sorted(running(stack))
                assert most - least <= balance_slack(least, SLOTS), running(stack)
            finally:
                for stream in streams:
                    stream.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
