"""The edge's per-request stream: ordered entries, stale attempts dropped, and one expiry timer
for the stream's whole life (waits past `expires_at` raise TimeoutError)."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.demux import Demux
from schemas.errors import ErrorCode
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from tests.wait import eventually


async def test_entries_arrive_in_order_and_stale_attempts_are_dropped():
    demux = Demux()
    stream = demux.open("r1", "acme", time.time() + 30)
    assert stream.feed(Delta("r1", 1, 0, "a", [1]), "w1")
    assert stream.feed(Delta("r1", 1, 1, "b", [2]), "w1")
    assert await stream.next_entries() == [Delta("r1", 1, 0, "a", [1]), Delta("r1", 1, 1, "b", [2])]
    # A newer attempt after tokens reached the client cannot be spliced in: worker_lost.
    assert stream.feed(Delta("r1", 2, 0, "x", [9]), "w2")
    [entry] = await stream.next_entries()
    assert isinstance(entry, StreamError) and entry.code == ErrorCode.worker_lost.value
    assert not stream.feed(Delta("r1", 1, 2, "c", [3]), "w1")    # ended: nothing more
    demux.close("r1")
    assert len(demux) == 0


async def test_a_gap_in_seq_ends_the_stream_with_an_error():
    stream = Demux().open("r1", "acme", time.time() + 30)
    stream.feed(Delta("r1", 1, 0, "a", [1]), "w1")
    stream.feed(Finished("r1", 1, 2, "stop", TokenUsage(1, 2)), "w1")
    first, second = await stream.next_entries()
    assert isinstance(second, StreamError) and "expected chunk 1, got 2" in second.message


async def test_waiting_past_the_expiry_raises_timeout_and_close_cancels_the_timer():
    demux = Demux()
    stream = demux.open("r1", "acme", time.time() + 0.05)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await stream.next_entries()
    assert asyncio.get_running_loop().time() - started >= 0.04
    with pytest.raises(TimeoutError):               # stays expired
        await stream.next_entries()

    kept = demux.open("r2", "acme", time.time() + 0.05)
    demux.close("r2")
    # a timer set later for the same expiry fires after r2's would have: once it has, r2's did not
    later = demux.open("r3", "acme", time.time() + 0.05)
    assert await eventually(lambda: later.expired)
    assert not kept.expired
