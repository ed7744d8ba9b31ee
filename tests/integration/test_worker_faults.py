"""A worker under faults, against a real nats-server: a publish that fails never stops its
flusher, a flusher that dies stops the worker (exit code 1) instead of leaving it taking work it
cannot answer, a malformed batch is skipped, and a stream cut by a nats-server crash is metered
at the tokens that were delivered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import nats.errors
import nats.js.errors
import pytest

from bridge.client import LanewayClient, LanewayError
from core.connect import NatsSettings
from core.natsd import NatsServer
from core.topology import StreamLimits, ensure_topology
from loadtest.stack import Stack, demo_settings
from schemas import codec
from schemas.subjects import Subjects
from schemas.usage import Usage
from tests.integration.test_poison_and_overload import PoisonableEngine, dlq_messages, stored_is
from tests.requests import chat
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import Worker, WorkerConfig

KEY = "sk-worker-faults"


def counted(worker: Worker, metric: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(metric, {"pool": worker.config.pool, **labels})
    return value or 0.0


async def answer(client: LanewayClient, content: str, max_tokens: int = 3, **kw) -> str:
    parts = [t async for t in client.generate(chat(content, max_tokens=max_tokens), **kw)]
    return "".join(parts)


@pytest.fixture
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()


async def test_a_dead_letter_that_cannot_be_stored_leaves_the_flusher_serving(nats_server, nc):
    """The fault: the DLQ stream is gone when the last attempt fails. The worker's flusher counts
    the failed publish and goes on; the request's TERM is withheld, so once the DLQ is back the
    broker dead-letters it from JetStream's max-deliveries advisory."""
    limits = StreamLimits(max_deliver=2, ack_wait_s=5.0)
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[PoisonableEngine(PROFILES["zero"])],
        limits=limits,
        prefix="dlqfail",
    ) as stack:
        worker, js = stack.workers[0], nc.jetstream()
        await js.delete_stream("DLQFAIL_DLQ")
        async with LanewayClient(nc, "demo", prefix="dlqfail") as client:
            with pytest.raises(LanewayError) as err:
                await answer(client, "POISON pill", timeout_s=60)
            assert err.value.code == "engine_error" and "2 attempts" in err.value.message
            # Dead letters are published before the frames of their flush: counted already.
            assert counted(worker, "laneway_worker_publish_failures_total", kind="dead_letter") == 1
            await ensure_topology(js, Subjects("dlqfail"), limits)
            # The same worker, the only one, still answers: its flusher survived.
            assert len((await answer(client, "still there?", timeout_s=60)).split()) == 3
        assert worker.dead is None
        assert await eventually(lambda: _dead_lettered(nc, "max_deliver"), timeout=60)
        assert await eventually(lambda: stored_is(nc, "DLQFAIL_REQ", 0))


async def _dead_lettered(nc, reason: str) -> bool:
    return [m.headers["Laneway-Reason"] for m in await dlq_messages(nc, "DLQFAIL_DLQ")] == [reason]


class UnencodableEngine(SimEngine):
    """The sim engine, except that a prompt with BUG yields a token id msgpack cannot encode: a
    bug that makes the outbox's flush raise, the way a flusher dies."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        bug = any("BUG" in t for t in request.body.texts())
        async for out in super().generate(request):
            if bug and out.token_ids:
                out.token_ids = [object()]
            yield out


async def test_a_worker_whose_flusher_dies_stops_taking_work_and_exits_nonzero(nats_server, nc):
    async with Stack(
        nats_server.url, demo_settings(KEY), engines=[UnencodableEngine(PROFILES["zero"])], prefix="flushdie"
    ) as stack:
        worker = stack.workers[0]
        async with LanewayClient(nc, "demo", prefix="flushdie") as client:
            request = asyncio.create_task(answer(client, "BUG", timeout_s=60))
            assert await asyncio.wait_for(worker.wait(), 60) == 1
            assert isinstance(worker.dead, TypeError)
            pull_loop = next(t for t in worker._tasks if t.get_name() == "pull-loop")
            assert await eventually(pull_loop.done)
            assert not pull_loop.cancelled() and pull_loop.exception() is None  # ended: no more pulls
            # ... and it tells the edges it no longer takes work.
            assert await eventually(
                lambda: any(beat.worker_id == worker.id and not beat.ready for beat in stack.bridge.readiness.workers())
            )
            request.cancel()
            await asyncio.wait([request])


async def test_a_malformed_batch_is_skipped_and_the_worker_serves_on(nats_server, nc):
    """The test answers the worker's first pull with garbage before the broker does (the broker
    holds a pull open while it has no work); the next pull gets real work."""
    async with Stack(nats_server.url, demo_settings(KEY), engines=[], prefix="badbatch"):
        garbage_sent = asyncio.Event()

        async def first_pull_gets_garbage(msg) -> None:
            if not garbage_sent.is_set():
                garbage_sent.set()
                await nc.publish(msg.reply, b"\xc1 is not msgpack")

        await nc.subscribe("badbatch.pull.sim", cb=first_pull_gets_garbage)
        await nc.flush()
        config = WorkerConfig(nats=NatsSettings(url=nats_server.url, prefix="badbatch"), pool="sim")
        async with Worker(config, SimEngine(PROFILES["zero"])) as worker:
            assert await eventually(lambda: counted(worker, "laneway_worker_malformed_batches_total") == 1)
            async with LanewayClient(nc, "demo", prefix="badbatch") as client:
                assert len((await answer(client, "after the garbage", timeout_s=60)).split()) == 3
            assert worker.dead is None


async def usage_record(nc, s: Subjects, request_id: str) -> Usage:
    """The request's record in LW_USAGE, as soon as it is stored."""
    js = nc.jetstream()
    assert await eventually(lambda: _stream_ready(js, s.usage_stream), timeout=60)
    sub = await js.subscribe(s.usage("demo"), stream=s.usage_stream, ordered_consumer=True)
    try:
        while True:
            usage = codec.decode_usage((await sub.next_msg(timeout=60)).data)
            if usage.request_id == request_id:
                return usage
    finally:
        await sub.unsubscribe()


async def _stream_ready(js, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except (TimeoutError, nats.errors.Error):
        return False
    return True


async def test_a_stream_cut_by_a_nats_crash_is_metered_at_what_was_delivered(tmp_path):
    """nats-server is SIGKILLed mid-stream and restarted on its store. Frames the worker could
    not publish meanwhile are not metered: the record is marked interrupted, with fewer
    completion tokens than were generated."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    max_tokens = 1000  # ~7 ms a step on this profile: ~7 s of streaming
    try:
        async with Stack(
            server.url, demo_settings(KEY), engines=[SimEngine(PROFILES["llama-8b-h100"])], prefix="cut"
        ) as stack:
            worker = stack.workers[0]
            async with LanewayClient(nc, "demo", prefix="cut") as client:
                received: list[str] = []

                async def stream() -> None:
                    async for text in client.generate(
                        chat("a long story", max_tokens=max_tokens), timeout_s=120, request_id="cut-1"
                    ):
                        received.append(text)

                consumer = asyncio.create_task(stream())
                assert await eventually(lambda: received)  # tokens are flowing
                await server.kill()
                assert await eventually(
                    lambda: counted(worker, "laneway_worker_publish_failures_total", kind="frame") > 0
                )
                await server.start()  # same port, same store
                usage = await usage_record(nc, Subjects("cut"), "cut-1")
                consumer.cancel()  # it may still wait for an end it will never get
                await asyncio.wait([consumer])
                if not consumer.cancelled() and consumer.exception() is not None:
                    assert isinstance(consumer.exception(), LanewayError)  # the gap, seen at the edge
        print(
            f"\n[nats crash mid-stream] max_tokens={max_tokens} received={len(''.join(received).split())} "
            f"metered={usage.completion_tokens} undelivered={usage.undelivered_tokens}"
        )
        assert usage.interrupted
        assert usage.undelivered_tokens > 0
        assert len("".join(received).split()) <= usage.completion_tokens < max_tokens
        assert usage.completion_tokens + usage.undelivered_tokens <= max_tokens
    finally:
        await nc.close()
        await server.stop()
