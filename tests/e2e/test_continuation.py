"""A stream outlives its worker: under `laneway up --workers 2`, SIGKILL of a worker mid-stream
costs its clients a stall, not their answers. Every stream completes with every token once,
equal token by token (the sim's words are its tokens) to an unbroken run of the same requests,
with the same finish_reason and usage, and one usage record each. A request whose worker dies
more often than `--max-migrations` allows is ended with a clear `worker_lost` and dead-lettered.

One `up` for the module (the sim is deterministic at temperature 0; no response cache, or the
second run would be replayed from it), NATS without auth so the
test reads usage records and dead letters as they are published. Only positive signals are
waited for: tokens on the wire, a worker publishing frames, the stream ending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest
import pytest_asyncio

from loadtest.processes import LanewayUp
from schemas.subjects import Subjects
from tests.kills import (
    HANG_S,
    Stream,
    read,
    run_streams,
    same_as_unbroken,
    sim_chats,
    streaming_worker,
    up_flags,
    usage_records,
    worker_metric,
)
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-continue"
STREAMS = 100  # the count, for the SIGKILL; the silent worker's fence needs fewer
FENCED_STREAMS = 24


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = up_flags()
    async with LanewayUp(tmp_path_factory.mktemp("continue") / "lw", KEY, extra) as running:
        yield running


async def run(
    up: LanewayUp, http: aiohttp.ClientSession, kill: signal.Signals | None, n: int = STREAMS
) -> tuple[list[Stream], int]:
    return await run_streams(up, http, sim_chats(n), kill)


async def test_a_worker_killed_mid_stream_costs_no_answer(up: LanewayUp) -> None:
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            unbroken, _ = await run(up, http, kill=None)
            assert all(s.status == 200 and s.error is None and s.finish_reason for s in unbroken), [
                s.error for s in unbroken
            ]
            broken, victim = await run(up, http, kill=signal.SIGKILL)
        # One usage record per request, the same counts as unbroken; some went on elsewhere.
        continued = await same_as_unbroken(unbroken, broken, records, nc)
        # The stall its clients saw (last token before the kill → next after), for the record.
        stalls = sorted(s.stall() for s, n in zip(broken, continued, strict=True) if n)
        print(
            f"\ncontinued {len(stalls)}/{STREAMS} streams; stall p50 {stalls[len(stalls) // 2]:.2f} s, "
            f"max {stalls[-1]:.2f} s (0.5 s heartbeats)"
        )
        assert await eventually(lambda: up.role_pids("worker") not in ([], [victim])), "the worker never came back"
    finally:
        await nc.close()


async def test_a_request_whose_workers_keep_dying_is_dead_lettered(up: LanewayUp) -> None:
    nc = await up.connect_nats("")
    dead: list = []

    async def on_dead(msg) -> None:
        dead.append(msg)

    await nc.subscribe(Subjects().dlq_all, cb=on_dead)
    records = await usage_records(nc)
    long = {
        "model": "laneway-sim",
        "stream": True,
        "temperature": 0.0,
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": "the poison pill"}],
    }
    stream = Stream()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            task = asyncio.create_task(read(http, up, long, stream))
            for death in range(3):  # the default --max-migrations is 2: the third loss ends it
                seen = stream.chunks
                assert await eventually(lambda seen=seen: stream.chunks > seen or stream.done, timeout=HANG_S)
                assert not stream.done, (death, stream.error)
                victim = await streaming_worker(http, up)
                os.kill(victim, signal.SIGKILL)
            await asyncio.wait_for(task, HANG_S)
        assert stream.error is not None and stream.error["code"] == "worker_lost", stream.error
        assert "dead-lettered" in stream.error["message"], stream.error
        assert await eventually(
            lambda: any(m.headers and m.headers.get("Laneway-Reason") == "max_migrations" for m in dead), timeout=HANG_S
        ), [m.headers for m in dead]
        # Metered once, by the worker that dead-lettered it: every token the client got from the
        # three that died (none of them lived to meter its part).
        assert await eventually(lambda: stream.request_id in records, timeout=HANG_S)
        await nc.flush()
        [usage] = records[stream.request_id]
        assert usage.finish_reason == "worker_lost" and usage.completion_tokens == len(stream.text.split()), usage
    finally:
        await nc.close()


async def test_a_worker_judged_lost_while_only_silent_is_fenced(up: LanewayUp) -> None:
    """SIGSTOP, not SIGKILL: the scheduler judges the worker lost and its streams go on elsewhere;
    when it wakes it reads its fence and drops them, so each request still has ONE usage record
    (not a second, for a generation nobody receives) and the answers are the unbroken run's."""
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            unbroken, _ = await run(up, http, kill=None, n=FENCED_STREAMS)
            fenced_before = sum((await worker_metric(http, up, "laneway_worker_fenced_total")).values())
            broken, victim = await run(up, http, kill=signal.SIGSTOP, n=FENCED_STREAMS)
            assert [s.error for s in broken] == [None] * FENCED_STREAMS, [s.error for s in broken if s.error]
            for i, (a, b) in enumerate(zip(unbroken, broken, strict=True)):
                assert b.text == a.text, (i, a.text, b.text)
                assert b.finish_reason == a.finish_reason, i

            # The woken worker holds nothing: it dropped what it was fenced from (without the fence it
            # generates each to its end, nobody reading, and meters it a second time).
            async def idle() -> bool:
                return (await worker_metric(http, up, "laneway_worker_slots_in_use")).get(victim) == 0

            assert await eventually(idle, timeout=HANG_S), "the woken worker never let go"
            fenced = await worker_metric(http, up, "laneway_worker_fenced_total")
            assert await eventually(lambda: all(s.request_id in records for s in broken)), "usage records missing"
            await nc.flush()
        for s in broken:
            assert len(records[s.request_id]) == 1, [(u.worker_id, u.finish_reason) for u in records[s.request_id]]
        assert fenced.get(victim, 0) > 0 and sum(fenced.values()) > fenced_before, fenced
        assert any(records[s.request_id][0].continued_tokens for s in broken), "no stream went on elsewhere"
    finally:
        await nc.close()
