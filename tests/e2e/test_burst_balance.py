"""A burst lands within the balance rule: under `laneway up --workers 2`, 60 streams sent together
(600 tokens, short distinct prompts: no prefix for affinity to weigh) are placed on the two idle
workers not more than BALANCE above the least loaded (or BALANCE_FLOOR of its slots), as
`broker/affinity.py` promises. Before, the first worker to pull again after the burst began took
every waiting request in one batch (49 to 11).

Placements are counted from the usage records, which name the worker that served each request.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from datetime import datetime, timezone

import aiohttp
import pytest
import pytest_asyncio

from broker.affinity import balance_slack
from core.usage_log import read_usage
from loadtest.http_client import Result, stream_chat
from loadtest.processes import LanewayUp
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300),
              pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children")]

KEY = "sk-burst-balance"
STREAMS = 60
SLOTS = 256             # the llama-8b-h100 sim profile's max_seqs, each worker's slots


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = ["--pii", "off", "--workers", "2", "--sim-profile", "llama-8b-h100", "--sim-max-seqs", str(SLOTS),
             "--initial-stream-limit", "0"]     # the bridge's measured limit is not what this counts
    async with LanewayUp(tmp_path_factory.mktemp("burst") / "lw", KEY, extra) as running:
        yield running


def body(n: int) -> dict:
    return {"model": "laneway-sim", "stream": True, "max_tokens": 600, "temperature": 0.7,
            "messages": [{"role": "user", "content": f"Question {n}: what is a lane?"}]}


async def placements(up: LanewayUp, since: datetime) -> Counter[str]:
    nc = await up.connect_nats("ops")
    try:
        return Counter([u.worker_id async for u in read_usage(nc.jetstream(), Subjects(), "demo", since,
                                                              idle_timeout=2)])
    finally:
        await nc.close()


async def test_a_burst_on_two_idle_workers_lands_within_the_balance(up: LanewayUp) -> None:
    since = datetime.now(timezone.utc)
    results = [Result() for _ in range(STREAMS)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(stream_chat(http, up.url, KEY, body(n), result=r) for n, r in enumerate(results)))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]

    counts: Counter[str] = Counter()

    async def all_metered() -> bool:
        nonlocal counts
        counts = await placements(up, since)
        return sum(counts.values()) == STREAMS

    assert await eventually(all_metered, timeout=60), counts
    assert len(counts) == 2, counts
    least, most = min(counts.values()), max(counts.values())
    assert most - least <= balance_slack(least, SLOTS), counts
