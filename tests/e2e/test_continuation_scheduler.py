"""A worker and the scheduler killed in the same moment (issue 36): under `laneway up --brokers 2
--workers 2`, SIGKILL of the broker holding the scheduler lease and of the worker streaming
most of the streams, together. Nobody is left who knew what the dead worker ran, so nobody
hands its requests back: JetStream delivers them again after `--ack-wait` (short here, with the
workers' in-progress acks well inside it), the standby broker, now the scheduler, dispatches
them, and each stream goes on from its next token. Every stream completes, equal token by token
to an unbroken run, metered once.

Positive signals only: tokens on the wire, a worker publishing frames, the streams ending, a
broker holding the lease.
"""

from __future__ import annotations

import signal
import sys

import aiohttp
import pytest
import pytest_asyncio

from loadtest.processes import LanewayUp
from tests.kills import HANG_S, run_streams, same_as_unbroken, sim_chats, up_flags, usage_records
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-scheduler-and-worker"
STREAMS = 24


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = [*up_flags(), "--brokers", "2", "--ack-wait", "10", "--in-progress-interval", "1"]
    async with LanewayUp(tmp_path_factory.mktemp("both") / "lw", KEY, extra) as running:
        yield running


async def test_a_worker_killed_with_the_scheduler_costs_no_answer(up: LanewayUp) -> None:
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    chats = sim_chats(STREAMS)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            unbroken, _ = await run_streams(up, http, chats, kill=None)
            scheduler = await up.schedulers(http)
            assert len(scheduler) == 1, scheduler
            broken, _victim = await run_streams(up, http, chats, kill=signal.SIGKILL, along=(scheduler[0],))
            await same_as_unbroken(unbroken, broken, records, nc)

            async def taken_over() -> bool:
                return (await up.schedulers(http)) not in ([], scheduler)

            assert await eventually(taken_over, timeout=HANG_S), "no other broker took the lease"
    finally:
        await nc.close()
