"""Work whose bridge is gone is cancelled in the engine (issue 35), under `laneway up`.

A long stream's bridge SIGKILLed: the worker stops generating for nobody within seconds (the
usage record says `cancelled`, with fewer tokens than `max_tokens`, and the slot comes back). A
bridge merely frozen (SIGSTOP, longer than the worker's no-interest threshold) keeps its stream:
once it runs again the stream ends whole. Both wait for positive signals only: the usage record,
the worker's own count of probes that found the frozen bridge still subscribed.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
from datetime import UTC, datetime

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from core.usage_log import read_usage
from loadtest.http_client import Result, stream_chat
from loadtest.processes import LanewayUp, metrics_port
from schemas.subjects import Subjects
from tests.wait import eventually
from workers.orphans import GONE_S, PROBE_S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(400),
    pytest.mark.skipif(sys.platform != "linux", reason="finds the children in /proc"),
]

KEY = "sk-orphans"
# At --sim-speed 0.05 the simulated GPU makes ~7 tokens a second: 1,500 are over three minutes
# of generation for nobody, 200 outlast the freeze below by far.
MAX_TOKENS = 1500
FROZEN_TOKENS = 200


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = ["--pii", "off", "--sim-profile", "llama-8b-h100", "--sim-speed", "0.05"]
    async with LanewayUp(tmp_path_factory.mktemp("orphans") / "lw", KEY, extra) as running:
        yield running


def body(max_tokens: int) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "a long answer, please"}],
    }


async def worker_sample(up: LanewayUp, name: str, **labels: str) -> float:
    """A sample of the (one) worker's metrics, summed over the labels not given; 0 if absent."""
    [worker] = up.role_pids("worker")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{metrics_port(worker)}/metrics") as resp:
            text = await resp.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


async def streaming(
    up: LanewayUp, http: aiohttp.ClientSession, result: Result, max_tokens: int = MAX_TOKENS
) -> asyncio.Task:
    """A long stream, once its first tokens reached the client (the bridge up first: `up` may
    be restarting it after the previous test)."""

    async def served() -> bool:
        try:
            return (await stream_chat(http, up.url, KEY, body(2))).ok
        except aiohttp.ClientError:
            return False

    assert await eventually(served, timeout=120)
    task = asyncio.create_task(stream_chat(http, up.url, KEY, body(max_tokens), result=result))
    assert await eventually(lambda: result.tokens > 0 or task.done(), timeout=120) and not task.done(), result
    return task


async def test_a_frozen_bridge_keeps_its_stream(up: LanewayUp) -> None:
    [bridge] = up.role_pids("bridge")
    result = Result()
    async with aiohttp.ClientSession() as http:
        task = await streaming(up, http, result, FROZEN_TOKENS)
        # Frozen for longer than a bridge without interest is given, as the worker counts it: its
        # probes of this bridge (and one more), or the generation ended meanwhile (cancelled).
        enough = await worker_sample(up, "laneway_worker_edge_probes_total") + math.ceil(GONE_S / PROBE_S) + 2

        async def probed_or_ended() -> bool:
            return (
                await worker_sample(up, "laneway_worker_edge_probes_total") >= enough
                or await worker_sample(up, "laneway_worker_slots_in_use") == 0
            )

        os.kill(bridge, signal.SIGSTOP)
        try:
            assert await eventually(probed_or_ended, timeout=60, interval=0.2)
        finally:
            os.kill(bridge, signal.SIGCONT)
        await asyncio.wait_for(task, timeout=300)
    assert result.ok and result.finish_reason == "length", (result.error, result.finish_reason)
    assert await worker_sample(up, "laneway_worker_orphans_cancelled_total") == 0
    # ... and the freeze did outlast the threshold while the generation ran.
    assert await worker_sample(up, "laneway_worker_edge_probes_total", answer="interest") >= enough


async def test_a_killed_bridges_generation_is_cancelled_in_the_engine(up: LanewayUp) -> None:
    since = datetime.now(UTC)
    [bridge] = up.role_pids("bridge")
    result = Result()
    async with aiohttp.ClientSession() as http:
        probed = await worker_sample(up, "laneway_worker_edge_probes_total", answer="interest")
        task = await streaming(up, http, result)

        async def found_alive() -> bool:  # only a bridge the worker found alive once is ever gone
            return await worker_sample(up, "laneway_worker_edge_probes_total", answer="interest") > probed

        assert await eventually(found_alive, timeout=60, interval=0.2)
        os.kill(bridge, signal.SIGKILL)
        await asyncio.wait([task], timeout=60)
    assert result.request_id

    nc = await up.connect_nats("ops")
    try:

        async def metered():
            records = [u async for u in read_usage(nc.jetstream(), Subjects(), "demo", since, idle_timeout=1)]
            return [u for u in records if u.request_id == result.request_id]

        # Generating all of MAX_TOKENS for nobody takes over a minute: its record comes far later.
        assert await eventually(metered, timeout=45, interval=0.5), "the generation went on"
        [usage] = await metered()
    finally:
        await nc.close()
    assert usage.finish_reason == "cancelled" and usage.completion_tokens < MAX_TOKENS, usage
    assert await eventually(lambda: _slots_free(up), timeout=30)


async def _slots_free(up: LanewayUp) -> bool:
    return await worker_sample(up, "laneway_worker_slots_in_use") == 0
