"""A resumable stream's event log (bridge/resume/replay.py): one id per event, [DONE] without one, the
events after a position, the oldest trimmed only once handed out, and one reader at a time: a
resume that takes over stops the former reader without losing an entry."""

from __future__ import annotations

import asyncio
import time

import pytest

from bridge.generate.translate import to_generate
from bridge.metrics import BridgeMetrics
from bridge.render.chat import renderer_for
from bridge.resume.replay import BadEventId, EventId, NotYet, Replay, Trimmed, follow
from bridge.resume.window import Resumes
from bridge.streams.demux import BufferLimits, Demux
from schemas.frames import Delta, Finished, TokenUsage
from tests.requests import chat
from tests.wait import eventually


def replay(n: int = 1, limit: int = 1 << 20) -> tuple[Replay, Demux]:
    generate = to_generate(
        chat("hi", n=n, stream=True),
        b"",
        request_id="r" * 32,
        tenant="acme",
        klass="interactive",
        reply_to="lw.tok.acme.e",
        edge="e",
        now=time.time(),
        deadline=time.time() + 30,
    )
    demux = Demux()
    stream = demux.open(generate.request_id, "acme", time.time() + 30)
    return Replay(
        "edge01",
        generate,
        "/v1/chat/completions",
        stream,
        renderer_for(generate),
        BridgeMetrics(),
        time.monotonic(),
        limit,
        lambda *_: None,
    ), demux


def ids(events: list[bytes]) -> list[str | None]:
    return [e.split(b"\n", 1)[0][4:].decode() if e.startswith(b"id: ") else None for e in events]


async def test_each_event_has_its_id_and_done_has_none():
    log, _ = replay(n=2)
    log.add([Delta(log.request_id, 0, 0, "a", [1]), Delta(log.request_id, 0, 1, "b", [2], choice=1)])
    log.add([Finished(log.request_id, 0, 2, "stop", TokenUsage(1, 2))])
    events, last = log.since(-1)
    # start: one role chunk per choice; two deltas; finish: one chunk per choice; [DONE].
    assert ids(events) == [f"edge01.{'r' * 32}.{i}" for i in range(6)] + [None]
    assert events[-1] == b"data: [DONE]\n\n" and log.finished and last == 6
    assert log.since(3)[0] == events[4:]
    with pytest.raises(NotYet):
        log.since(7)


async def test_the_oldest_events_go_once_handed_out_and_a_resume_before_them_is_refused():
    log, _ = replay(limit=2000)
    for seq in range(40):
        log.add([Delta(log.request_id, 0, seq, "word ", [seq])])
    assert log.base > 0 and log.size <= 2000
    with pytest.raises(Trimmed):
        log.since(0)
    assert log.problem(0)[0] == "trimmed" and log.problem(log.count - 1) is None


async def test_a_resume_takes_over_from_a_waiting_reader_without_losing_entries():
    log, _ = replay()
    first, second = object(), object()
    log.owner = first
    seen: list[bytes] = []

    async def sink(events: list[bytes], upto: int) -> None:
        seen.extend(events)

    reader = asyncio.create_task(follow(log, first, sink, -1))
    await asyncio.sleep(0)
    log.owner = second
    log.stream.interrupt()
    assert await reader is False  # it looked, and left
    log.stream.feed(Delta(log.request_id, 0, 0, "x", [1]), "w")
    log.stream.feed(Finished(log.request_id, 0, 1, "stop", TokenUsage(1, 1)), "w")
    resumed: list[bytes] = []

    async def sink2(events: list[bytes], upto: int) -> None:
        resumed.extend(events)

    assert await follow(log, second, sink2, len(seen) - 1) is True
    assert b'"x"' in b"".join(resumed) and resumed[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "raw", ["", "a", "a.b", "a.b.c", "a.b.-1", "a.b.01", "a.b.c.1", "a.b c.1", "a." + "b" * 65 + ".1"]
)
def test_a_malformed_event_id_is_refused(raw):
    with pytest.raises(BadEventId):
        EventId.parse(raw)


def test_an_event_id_names_the_edge_the_request_and_the_position():
    assert EventId.parse(" e1.r1.42 ") == EventId("e1", "r1", 42)


class Held:
    """A `Resumes` over a real Demux, its cancels recorded."""

    def __init__(self, limits: BufferLimits, window_s: float = 600.0) -> None:
        self.demux = Demux(limits=limits)
        self.metrics = BridgeMetrics()
        self.cancelled: list[str] = []
        self.resumes = Resumes("edge01", window_s, limits, self.demux, self.metrics, self._cancel)

    async def _cancel(self, tenant: str, request_id: str) -> None:
        self.cancelled.append(request_id)

    def open(self, request_id: str, tenant: str = "acme") -> Replay:
        generate = to_generate(
            chat("hi", stream=True),
            b"",
            request_id=request_id,
            tenant=tenant,
            klass="interactive",
            reply_to=f"lw.tok.{tenant}.e",
            edge="e",
            now=time.time(),
            deadline=time.time() + 60,
        )
        stream = self.demux.open(request_id, tenant, generate.deadline)
        replay, token = self.resumes.open(
            generate, "/v1/chat/completions", stream, renderer_for(generate), time.monotonic()
        )
        self.token = token
        return replay


def feed(replay: Replay, words: int, start: int = 0) -> None:
    for seq in range(start, start + words):
        replay.stream.feed(Delta(replay.request_id, 0, seq, "word " * 20, [seq]), "w")


async def test_an_abandoned_stream_past_its_bytes_is_expired_and_cancelled():
    held = Held(BufferLimits(stream_bytes=8_000))
    replay = held.open("a" * 32)
    await held.resumes.release(replay, held.token, completed=False)  # its client left
    feed(replay, 100)
    assert await eventually(lambda: held.cancelled == [replay.request_id])
    assert len(held.resumes) == 0 and len(held.demux) == 0
    assert held.metrics.registry.get_sample_value("laneway_streams_expired_total") == 1


async def test_a_tenants_abandoned_streams_past_its_bytes_go_cleanly_ended_first():
    held = Held(BufferLimits(resume_bytes=6_000))
    ended = held.open("e" * 32)
    ended.add(
        [Delta(ended.request_id, 0, seq, "word " * 20, [seq]) for seq in range(10)]
        + [Finished(ended.request_id, 0, 10, "stop", TokenUsage(1, 10))]
    )
    await held.resumes.release(ended, held.token, completed=True)
    cut = held.open("c" * 32)
    await held.resumes.release(cut, held.token, completed=False)
    other = held.open("o" * 32, tenant="globex")  # another tenant's share is its own
    await held.resumes.release(other, held.token, completed=False)
    feed(cut, 10)
    assert await eventually(lambda: held.resumes.get(ended.request_id) is None)
    assert held.resumes.get(cut.request_id) is not None and held.cancelled == []  # ended: nothing to cancel
    feed(cut, 30, start=10)
    assert await eventually(lambda: held.cancelled == [cut.request_id])
    assert held.resumes.get(other.request_id) is other
    await held.resumes.stop()
    assert held.cancelled == [cut.request_id, other.request_id]
