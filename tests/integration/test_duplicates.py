"""A retried publish (the same random Nats-Msg-Id) is stored once and generated once; the same
request id published again is refused (broker/received.py)."""

from __future__ import annotations

import dataclasses
import time
import uuid

import aiohttp
import nats
import pytest

from core.natsd import NatsServer
from loadtest.stack import Stack, demo_settings
from schemas import codec
from schemas.frames import Delta, Finished
from schemas.requests import GenerateRequest
from schemas.subjects import MSG_ID_HEADER
from tests.requests import chat
from tests.wait import eventually

KEY = "sk-dup"


@pytest.fixture
async def nats_server(tmp_path):
    """A server of this test's own: the checks below count generations and stored messages,
    which another test's late request on a shared server would change."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY), prefix="dup") as s:
        yield s


async def stored(stack) -> int:
    info = await stack.broker._nc.jetstream().stream_info(stack.broker.s.req_stream)
    return info.state.messages


async def settled(stack) -> bool:
    """Every stored request has been acked: nothing is left that could still be generated."""
    return await stored(stack) == 0


def finished_count(stack) -> float:
    """Requests the worker finished, any reason."""
    return sum(
        sample.value
        for metric in stack.workers[0].metrics.finished.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def listening(nc, request_id: str, inbox: str) -> tuple[GenerateRequest, list]:
    """A request answered on `inbox`, and the frames that arrive there."""
    frames: list = []

    async def collect(msg):
        frames.append(codec.decode_frame(msg.data))

    await nc.subscribe(inbox, cb=collect)
    now = time.time()
    return GenerateRequest(
        request_id=request_id,
        tenant="demo",
        klass="interactive",
        model="laneway-sim",
        reply_to=inbox,
        created_at=now,
        deadline=now + 60,
        chat=chat("hi", max_tokens=3),
    ), frames


async def test_a_republished_request_is_generated_once(stack, nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        request, frames = await listening(nc, "retry-me", "dup.tok.demo.retrier")
        before = finished_count(stack)
        acks, publish_id = [], uuid.uuid4().hex
        for _ in range(3):  # a publisher that timed out waiting for its PubAck and retried
            acks.append(
                await nc.jetstream().publish(
                    "dup.req.interactive.demo", codec.encode(request), headers={MSG_ID_HEADER: publish_id}
                )
            )
        assert [a.duplicate for a in acks] == [None, True, True]

        def finished_frames() -> list:
            return [e for f in frames for e in f.entries if isinstance(e, Finished)]

        assert await eventually(lambda: finished_frames()), "the request was never answered"
        assert await eventually(lambda: settled(stack)), "the request was never acked"
        finished = finished_frames()
        assert len(finished) == 1
        assert finished_count(stack) - before == 1
    finally:
        await nc.close()


async def test_a_copy_stored_past_the_streams_window_is_dropped_not_run_or_answered(stack, nats_server):
    """JetStream forgets a Nats-Msg-Id after its window: a publish retried later is stored again.
    The broker drops that copy (the same Nats-Msg-Id: the same publish) without generating it
    again or answering it. The window is cut to 1 s here to get there without waiting 120 s."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        config = (await js.stream_info(stack.broker.s.req_stream)).config
        await js.update_stream(dataclasses.replace(config, duplicate_window=1.0))
        request, frames = await listening(nc, "late-copy", "dup.tok.demo.late")
        before, publish_id = finished_count(stack), uuid.uuid4().hex

        async def publish() -> bool:
            ack = await js.publish(
                "dup.req.interactive.demo", codec.encode(request), headers={MSG_ID_HEADER: publish_id}
            )
            return not ack.duplicate

        assert await publish()

        def entries() -> list:
            return [e for f in frames for e in f.entries if not isinstance(e, Delta)]

        assert await eventually(entries), "the request was never answered"
        assert await eventually(publish), "the stream never stored the copy"  # past its window
        assert await eventually(lambda: settled(stack)), "the copy was never taken off the stream"
        assert [type(e) for e in entries()] == [Finished], entries()
        assert finished_count(stack) - before == 1
    finally:
        await js.update_stream(config)
        await nc.close()


async def test_idempotency_key_retry_gets_409_not_a_second_generation(stack):
    body = {"model": "laneway-sim", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
    headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "order-42"}
    before = finished_count(stack)
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.post("/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
        async with http.post("/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 409
            error = (await resp.json())["error"]
            assert error["code"] == "duplicate_request" and error["param"] == "Idempotency-Key"
    assert await eventually(lambda: settled(stack)), "the request was never acked"
    assert finished_count(stack) - before == 1
