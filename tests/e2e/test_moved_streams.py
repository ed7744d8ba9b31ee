"""What a client does to a stream that moved to another worker (issue 36) still works, under
`laneway up --workers 2` with a second bridge replica:

- a resumed stream (`x-laneway-resumable`, cut off and back with `Last-Event-ID`, through the
  same bridge or the other one, which relays it) whose worker is SIGKILLed goes on, every token
  once, equal to an unbroken run;
- a cancel sent after the stream moved stops the worker it moved to;
- the request's deadline (`x-laneway-timeout`) is the one it was sent with, not a fresh one on
  the worker that continues it.

Positive signals only: tokens on the wire, a worker publishing frames, usage records.
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
from tests.replicas import another_bridge
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-moved"
STREAMS = 16
# ~5 tokens a second a stream: the cut, the resumes and the kill all fall inside the answers
# (at 0.1, 16 streams' shortest answers took 4 s, over before their worker died).
SIM_SPEED = 0.04
RESUMABLE = {"x-laneway-resumable": "true"}
DEADLINE_S = 20.0  # past a stream's start, its kill and its move on a loaded machine; short of its end
LONG = {
    "model": "laneway-sim",
    "stream": True,
    "temperature": 0.0,
    "max_tokens": 4000,  # runs on past any deadline here
    "messages": [{"role": "user", "content": "a very long answer, please"}],
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    async with LanewayUp(tmp_path_factory.mktemp("moved") / "lw", KEY, up_flags(SIM_SPEED)) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def second(up: LanewayUp):
    async with another_bridge(up, "--initial-stream-limit", "0", "--max-delivery-lag", "0") as url:
        yield url


async def test_a_resumed_stream_outlives_its_worker(up: LanewayUp, second: str) -> None:
    """Each client is cut off after 3 chunks and comes back with its last event id, half at the
    bridge holding its stream, half at the other (relayed); then the worker streaming most of
    them is SIGKILLed. Every stream ends as its unbroken run did, metered once."""
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    chats = sim_chats(STREAMS)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            unbroken, _ = await run_streams(up, http, chats, kill=None)
            streams = [Stream() for _ in chats]
            await asyncio.gather(
                *(read(http, up, c, s, headers=RESUMABLE, cut_after=3) for c, s in zip(chats, streams, strict=True))
            )
            assert all(s.last_id and not s.done for s in streams), [(s.last_id, s.error) for s in streams]
            cut = [s.chunks for s in streams]
            resumed = [
                asyncio.create_task(
                    read(
                        http,
                        up,
                        {},
                        s,
                        url=second if i % 2 else up.url,
                        headers={**RESUMABLE, "Last-Event-ID": s.last_id},
                    )
                )
                for i, s in enumerate(streams)
            ]
            # Resumed and flowing again, then the worker carrying most of them dies.
            assert await eventually(
                lambda: all(s.chunks >= c + 2 for s, c in zip(streams, cut, strict=True)), timeout=HANG_S
            ), [(s.chunks, s.error) for s in streams]
            victim = await streaming_worker(http, up)
            os.kill(victim, signal.SIGKILL)
            _, hung = await asyncio.wait(resumed, timeout=HANG_S)
        assert not hung, f"{len(hung)} resumed streams hung"
        continued = await same_as_unbroken(unbroken, streams, records, nc)
        print(
            f"\n{sum(map(bool, continued))}/{STREAMS} resumed streams continued, of chunks {[s.chunks for s in streams]}"
        )
        # Resumed at the holder and relayed by the other bridge alike, streams went on elsewhere.
        assert any(continued[0::2]) and any(continued[1::2]), continued
    finally:
        await nc.close()


async def moved_away(http: aiohttp.ClientSession, up: LanewayUp, stream: Stream) -> int:
    """Once `stream` (the only one running) has tokens on the wire, SIGKILLs its worker and waits
    until another worker publishes frames: the stream went on there. Returns the victim's pid."""
    assert await eventually(lambda: stream.chunks >= 3 or stream.done, timeout=HANG_S)
    assert not stream.done, stream.error
    victim = await streaming_worker(http, up)
    os.kill(victim, signal.SIGKILL)
    at_kill = await worker_metric(http, up)

    async def elsewhere() -> bool:
        now = await worker_metric(http, up)
        return stream.done or any(n > at_kill.get(pid, 0.0) for pid, n in now.items() if pid != victim)

    assert await eventually(elsewhere, timeout=HANG_S)
    assert not stream.done, f"the stream ended instead of moving: {stream.error}"
    return victim


async def test_a_cancel_after_the_move_stops_the_new_worker(up: LanewayUp) -> None:
    """The client leaves once its stream went on on another worker: the bridge's cancel reaches
    that worker, which stops generating and meters the continuation as `cancelled` (without it,
    the answer runs on to its 4,000 tokens for nobody)."""
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    stream = Stream()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            task = asyncio.create_task(read(http, up, LONG, stream))
            await moved_away(http, up, stream)
            task.cancel()  # the client leaves: its connection closes
            await asyncio.gather(task, return_exceptions=True)
            assert await eventually(lambda: stream.request_id in records, timeout=HANG_S), (
                "no usage record: the worker it moved to generates on"
            )
            await nc.flush()

            async def idle() -> bool:
                return sum((await worker_metric(http, up, "laneway_worker_slots_in_use")).values()) == 0

            assert await eventually(idle, timeout=HANG_S), "a worker still holds the cancelled request"
        [usage] = records[stream.request_id]
        assert usage.finish_reason == "cancelled" and usage.continued_tokens > 0, usage
        assert usage.completion_tokens < LONG["max_tokens"], usage
    finally:
        await nc.close()


async def test_a_moved_stream_keeps_its_deadline(up: LanewayUp) -> None:
    """A request sent with a deadline of 20 s moves to another worker mid-stream; that worker
    ends it at the same deadline: its client gets `deadline_exceeded` from the worker and the
    continuation's usage record says so. With a fresh deadline on the move, the bridge ends the
    stream at the old one plus its grace and cancels the work (a `cancelled` record)."""
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    stream = Stream()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            headers = {"x-laneway-timeout": str(DEADLINE_S)}
            task = asyncio.create_task(read(http, up, LONG, stream, headers=headers))
            await moved_away(http, up, stream)
            await asyncio.wait_for(task, HANG_S)
            assert await eventually(lambda: stream.request_id in records, timeout=HANG_S)
            await nc.flush()
        assert stream.error is not None and stream.error["code"] == "deadline_exceeded", stream.error
        assert "during generation" in stream.error["message"], stream.error  # the worker's, not the edge's
        [usage] = records[stream.request_id]
        assert usage.finish_reason == "deadline_exceeded" and usage.continued_tokens > 0, usage
    finally:
        await nc.close()
