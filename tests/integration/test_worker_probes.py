"""The scheduler finds a dead worker by its NATS connection (broker/worker_probes.py), not only
by heartbeat silence: here the worker beats every 30 s, so silence would take 90 s, and the
request it ran is handed back (to go on elsewhere) once its connection is gone: at once, not at
the sweep's next tick (an hour away here), for that wait is part of every moved stream's stall."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from loadtest.http_client import Result, stream_chat
from loadtest.stack import Stack, demo_settings
from tests.deaths import LONG_STREAM, die_without_a_word
from tests.wait import eventually
from workers.config import WorkerConfig
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

pytestmark = pytest.mark.timeout(120)

KEY = "sk-probes"


async def test_a_worker_whose_connection_is_gone_is_found_by_the_scheduler(nats_server):
    engine = SimEngine(PROFILES["llama-8b-h100"], speed=0.05)
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[engine],
        worker_config=WorkerConfig(heartbeat_s=30),
        sweep_interval_s=3600,
    ) as stack:
        [worker] = stack.workers
        metrics = stack.broker.metrics

        def lost(signal: str) -> float:
            return metrics.registry.get_sample_value("laneway_workers_lost_total", {"signal": signal}) or 0.0

        def probes(answer: str) -> float:
            return metrics.registry.get_sample_value("laneway_worker_probes_total", {"answer": answer}) or 0.0

        result = Result()
        async with aiohttp.ClientSession() as http:
            task = asyncio.create_task(stream_chat(http, stack.url, KEY, LONG_STREAM, result=result))
            assert await eventually(lambda: result.tokens > 0 or task.done(), timeout=60) and not task.done()
            # Found alive first: only a worker found alive once is ever found gone this way.
            assert await eventually(lambda: probes("interest") > 0)
            assert lost("interest") == 0
            await die_without_a_word(worker)
            assert await eventually(lambda: lost("interest") == 1, timeout=30)
            assert lost("silence") == 0
            assert metrics.registry.get_sample_value("laneway_lost_worker_requests_total") == 1
            task.cancel()
