"""The edge's per-request stream: ordered entries, stale attempts dropped, and one expiry timer
for the stream's whole life (waits past `expires_at` raise TimeoutError)."""

from __future__ import annotations

import asyncio
import time

import pytest

from bridge.streams.demux import BufferLimits, Demux
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
    assert not stream.feed(Delta("r1", 1, 2, "c", [3]), "w1")  # ended: nothing more
    demux.close("r1")
    assert len(demux) == 0


async def test_a_gap_in_seq_ends_the_stream_with_an_error():
    stream = Demux().open("r1", "acme", time.time() + 30)
    stream.feed(Delta("r1", 1, 0, "a", [1]), "w1")
    stream.feed(Finished("r1", 1, 2, "stop", TokenUsage(1, 2)), "w1")
    _first, second = await stream.next_entries()
    assert isinstance(second, StreamError) and "expected chunk 1, got 2" in second.message


async def test_waiting_past_the_expiry_raises_timeout_and_close_cancels_the_timer():
    demux = Demux()
    stream = demux.open("r1", "acme", time.time() + 0.05)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await stream.next_entries()
    assert asyncio.get_running_loop().time() - started >= 0.04
    with pytest.raises(TimeoutError):  # stays expired
        await stream.next_entries()

    kept = demux.open("r2", "acme", time.time() + 0.05)
    demux.close("r2")
    # a timer set later for the same expiry fires after r2's would have: once it has, r2's did not
    later = demux.open("r3", "acme", time.time() + 0.05)
    assert await eventually(lambda: later.expired)
    assert not kept.expired


def _fill(stream, n: int, size: int) -> None:
    for seq in range(n):
        stream.feed(Delta(stream.request_id, 1, seq, "x", [1]), "w1", size)


async def test_a_stream_past_its_buffer_ends_with_slow_reader_and_frees_what_it_held():
    demux = Demux(limits=BufferLimits(stream_bytes=1000, tenant_bytes=10_000))
    stream = demux.open("r1", "acme", time.time() + 30)
    _fill(stream, 10, 100)
    assert demux.buffered_by("acme") == 1000 and not stream.closed  # at the limit, not past it
    stream.feed(Delta("r1", 1, stream.next_seq, "x", [1]), "w1", 100)
    [entry] = await stream.next_entries()  # what waited is dropped: only why it ends
    assert isinstance(entry, StreamError) and entry.code == ErrorCode.slow_reader.value
    assert stream.edge_failed and demux.buffered_by("acme") == 0
    assert not stream.feed(Delta("r1", 1, stream.next_seq, "x", [1]), "w1", 100)


async def test_past_the_tenant_limit_its_largest_buffer_ends_and_other_tenants_keep_theirs():
    demux = Demux(limits=BufferLimits(stream_bytes=10_000, tenant_bytes=1500))
    stalled, reading = demux.open("r1", "acme", time.time() + 30), demux.open("r2", "acme", time.time() + 30)
    other = demux.open("r3", "globex", time.time() + 30)
    _fill(other, 10, 100)
    _fill(stalled, 10, 100)
    _fill(reading, 6, 100)  # acme: 1,600 bytes waiting
    assert stalled.closed and not reading.closed and not other.closed
    assert demux.buffered_by("acme") == 600 and demux.buffered_by("globex") == 1000
    assert [e.code for e in await stalled.next_entries()] == [ErrorCode.slow_reader.value]
    assert len(await reading.next_entries()) == 6 and demux.buffered_by("acme") == 0


async def test_open_streams_are_counted_per_tenant_until_closed():
    demux = Demux()
    demux.open("r1", "acme", time.time() + 30)
    demux.open("r2", "acme", time.time() + 30)
    demux.open("r3", "globex", time.time() + 30)
    assert (demux.held_by("acme"), demux.held_by("globex"), demux.held_by("initech")) == (2, 1, 0)
    demux.close("r1")
    demux.close("r2")
    assert demux.held_by("acme") == 0 and len(demux) == 1
