"""The edge's answer to a redelivered request's worker (bridge/streams/continuation.py) and the
scheduler's record of what runs where (broker/running.py): pure, no server."""

from __future__ import annotations

import asyncio
import time

from bridge.streams.continuation import answer
from bridge.streams.demux import ResponseStream
from broker.running import HandedBack, Running
from schemas.continuation import ContinueAsk, Outcome
from schemas.frames import Delta, Finished, StreamError, TokenUsage


def streaming(*deltas: Delta) -> ResponseStream:
    stream = ResponseStream("r", "acme", time.time() + 60)
    for d in deltas:
        assert stream.feed(d, "w1")
    return stream


def test_a_stream_goes_on_after_what_its_client_got_and_drops_the_lost_worker_s_frames() -> None:
    async def main() -> None:
        stream = streaming(Delta("r", 1, 0, "Hello ", [11]), Delta("r", 1, 1, "there ", [12, 13]))
        said = answer(stream, "acme", ContinueAsk("r", 2, "w2"), max_migrations=2)
        assert (said.verdict, said.next_seq, said.token_ids, said.text) == (
            Outcome.CONTINUE,
            2,
            [11, 12, 13],
            "Hello there ",
        )
        assert stream.source == "w2" and stream.migrations == 1 and said.delivered == 3
        assert not stream.feed(Delta("r", 1, 2, "late ", [14]), "w1")  # the lost worker's
        assert stream.feed(Delta("r", 2, 2, "friend", [15]), "w2")
        assert stream.feed(Finished("r", 2, 3, "stop", TokenUsage(3, 4)), "w2")
        entries = await stream.next_entries()
        assert [e.seq for e in entries] == [0, 1, 2, 3] and isinstance(entries[-1], Finished)

    asyncio.run(main())


def test_the_answer_for_each_kind_of_stream() -> None:
    async def main() -> None:
        fresh = streaming()
        assert answer(fresh, "acme", ContinueAsk("r", 2, "w2"), 2).verdict is Outcome.FRESH
        assert answer(streaming(), "other", ContinueAsk("r", 2, "w2"), 2).verdict is Outcome.GONE
        assert answer(None, "acme", ContinueAsk("r", 2, "w2"), 2).verdict is Outcome.GONE
        stale = streaming(Delta("r", 3, 0, "a", [1]))
        assert answer(stale, "acme", ContinueAsk("r", 2, "w2"), 2).verdict is Outcome.GONE
        tools = streaming(Delta("r", 1, 0, "", [1], logprobs=[]), Delta("r", 1, 1, "", [], choice=1))
        said = answer(tools, "acme", ContinueAsk("r", 2, "w2"), 2)
        assert said.verdict is Outcome.GONE and said.delivered == 1  # metered by the worker asking
        assert isinstance((await tools.next_entries())[-1], StreamError)  # worker_lost, told at once
        tired = streaming(Delta("r", 1, 0, "a", [1]))
        for attempt in (2, 3):
            assert answer(tired, "acme", ContinueAsk("r", attempt, "w"), 2).verdict is Outcome.CONTINUE
        last = answer(tired, "acme", ContinueAsk("r", 4, "w"), 2)
        assert last.verdict is Outcome.EXHAUSTED and "dead-lettered" in last.reason and last.delivered == 1
        end = (await tired.next_entries())[-1]
        assert isinstance(end, StreamError) and end.code == "worker_lost" and "dead-lettered" in end.message

    asyncio.run(main())


def test_running_hands_back_a_lost_worker_s_requests_once() -> None:
    running = Running()
    running.add("w1", ("acme", "a"), "ack.a", deadline=100.0, attempt=2)
    running.add("w1", ("acme", "b"), "ack.b", deadline=100.0)
    running.add("w2", ("acme", "c"), "ack.c", deadline=100.0)
    running.ended(("acme", "b"))
    assert sorted(running.workers()) == ["w1", "w2"]
    assert running.lost("w1") == [HandedBack(("acme", "a"), "ack.a", 2)]  # the attempt its fence names
    assert running.lost("w1") == [] and running.workers() == ["w2"]
    running.expire(now=100.0 + 61)
    assert len(running) == 0 and running.workers() == []


def test_a_lost_worker_that_pulls_again_gets_its_fence_again_once() -> None:
    """A fence published while the worker's connection was down never reached it: its next pull
    (it is back) brings the fence again, once, while the fenced requests' deadlines last."""
    running = Running()
    running.add("w1", ("acme", "a"), "ack.a", deadline=100.0, attempt=2)
    running.add("w1", ("acme", "b"), "ack.b", deadline=50.0)
    running.add("w2", ("acme", "c"), "ack.c", deadline=100.0)
    running.lost("w1")
    assert running.fence_again("w2", now=10.0) is None  # never judged lost
    fence = running.fence_again("w1", now=10.0)
    assert fence is not None
    assert sorted((f.request_id, f.attempt) for f in fence.requests) == [("a", 2), ("b", 1)]
    assert running.fence_again("w1", now=11.0) is None  # once
    running.add("w1", ("acme", "d"), "ack.d", deadline=30.0)
    running.lost("w1")
    running.expire(now=30.0)  # every request it was fenced from is past its deadline: nothing kept
    assert running.fence_again("w1", now=30.0) is None
