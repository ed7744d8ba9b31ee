"""The intake's door on a real nats-server: a chat published behind a stored batch flood, or
behind another tenant's backlog in its own class, reaches the lanes at once and is served early,
while the flood still waits in JetStream.

JetStream delivers one consumer's messages in stream order; with one consumer on the whole
request stream, the broker (which takes at most `max_held`) saw the chat only after it had taken
every batch request stored before it, and with one per class, after every request of the other
tenant stored before it in that class.

The order asserted is the order requests reached the engine: the clients' own completion order
adds the event loop's scheduling between two clients' reply subscriptions, which a loaded machine
can reorder by one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import nats

from bridge.client import LanewayClient
from loadtest.stack import Stack, demo_settings
from tests.requests import chat
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import Worker, WorkerConfig

FLOOD = 40
MAX_HELD = 10  # batch may fill 90% of it (9), one tenant 90% of that (8)


class OneSlot(SimEngine):
    """One slot, remembering the order requests reached it: the order the lanes handed them."""

    def __init__(self) -> None:
        super().__init__(PROFILES["zero"], max_seqs=1)
        self.order: list[str] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.request_id != "warmup":  # the worker's own, before it takes work
            self.order.append(" ".join(request.body.texts()))
        async for out in super().generate(request):
            yield out


async def test_a_chat_stored_behind_a_batch_flood_is_pulled_and_served_first(nats_server):
    async with Stack(
        nats_server.url, demo_settings("sk-order"), engines=[], prefix="order", max_held=MAX_HELD
    ) as stack:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        s, lanes = stack.broker.s, stack.broker.scheduler.pools

        async def ask(klass: str, name: str) -> None:
            async for _ in client.generate(chat(name, max_tokens=2), klass=klass):
                pass

        async def batch_left_in_jetstream() -> int:
            return (await js.consumer_info(s.req_stream, s.intake_durable("batch", "demo"))).num_pending

        try:
            async with LanewayClient(nc, tenant="demo", prefix="order") as client:
                flood = [asyncio.create_task(ask("batch", f"batch-{i}")) for i in range(FLOOD)]
                # All stored before the chat is published; the broker took what fits.
                assert await eventually(lambda: _stored(js, s.req_stream, FLOOD))
                # Its share of the room: batch's of the broker, the tenant's of batch's.
                share = stack.broker.live.classes["batch"].tenant_slot_cap(MAX_HELD)
                assert await eventually(lambda: _waiting(lanes, "batch") == share)
                chat_task = asyncio.create_task(ask("interactive", "the-chat"))
                assert await eventually(lambda: _waiting(lanes, "interactive") == 1), (
                    "the chat waited in JetStream behind the batch flood"
                )
                assert _waiting(lanes, "batch") == share
                assert await batch_left_in_jetstream() == FLOOD - share

                # One slot: what the lanes hand it first is the chat, the flood after.
                config = replace(WorkerConfig(), nats=stack._nats("worker"), pool="sim")
                engine = OneSlot()
                async with Worker(config, engine):
                    await asyncio.wait_for(asyncio.gather(chat_task, *flood), 120)
                assert engine.order[0] == "the-chat", engine.order[:5]
                assert sorted(engine.order[1:]) == sorted(f"batch-{i}" for i in range(FLOOD))
        finally:
            await nc.close()


def _waiting(pools, klass: str, tenant: str | None = None) -> int:
    return sum(pool.lanes.depth(klass, tenant) for pool in pools.values())


async def _stored(js, stream: str, n: int) -> bool:
    return (await js.stream_info(stream)).state.messages == n


async def test_a_chat_stored_behind_another_tenants_backlog_in_its_class_is_pulled_at_once(nats_server):
    settings = demo_settings("sk-order-a", tenant="acme", extra_tenants={"globex": "sk-order-g"})
    async with Stack(nats_server.url, settings, engines=[], prefix="ordert", max_held=MAX_HELD) as stack:
        nc = await nats.connect(nats_server.url)
        s, lanes = stack.broker.s, stack.broker.scheduler.pools

        async def ask(client: LanewayClient, name: str) -> None:
            async for _ in client.generate(chat(name, max_tokens=2), klass="interactive"):
                pass

        try:
            async with (
                LanewayClient(nc, tenant="acme", prefix="ordert") as acme,
                LanewayClient(nc, tenant="globex", prefix="ordert") as globex,
            ):
                backlog = [asyncio.create_task(ask(acme, f"acme-{i}")) for i in range(FLOOD)]
                assert await eventually(lambda: _stored(nc.jetstream(), s.req_stream, FLOOD))
                share = stack.broker.live.classes["interactive"].tenant_slot_cap(MAX_HELD)
                assert await eventually(lambda: _waiting(lanes, "interactive") == share)
                chat_task = asyncio.create_task(ask(globex, "globex-chat"))
                assert await eventually(lambda: _waiting(lanes, "interactive", "globex") == 1), (
                    "the chat waited in JetStream behind the other tenant's backlog"
                )
                acme_left = await nc.jetstream().consumer_info(s.req_stream, s.intake_durable("interactive", "acme"))
                assert acme_left.num_pending == FLOOD - share

                # One slot: the lanes share the class between the two tenants from the start.
                config = replace(WorkerConfig(), nats=stack._nats("worker"), pool="sim")
                engine = OneSlot()
                async with Worker(config, engine):
                    await asyncio.wait_for(asyncio.gather(chat_task, *backlog), 120)
                assert "globex-chat" in engine.order[:2], engine.order[:5]
        finally:
            await nc.close()
