"""The simulated engine knows a request by (tenant, request_id): request ids are the client's, so
two tenants may run the same one at once, and aborting one tenant's never touches the other's.
Before issue 20 the second tenant's request was refused as "already running", and an abort by
id alone ended whichever request held it."""

from __future__ import annotations

import asyncio

import pytest

from schemas.openai import ChatBody, Message
from workers.engine import EngineError, EngineOutput, EngineRequest, RequestKey
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

pytestmark = pytest.mark.timeout(60)


def request(tenant: str, max_tokens: int) -> EngineRequest:
    body = ChatBody(model="sim", messages=[Message(role="user", content=f"hello from {tenant}")],
                    max_tokens=max_tokens)
    return EngineRequest("same-id", body, tenant=tenant, klass="batch")


async def collect(engine: SimEngine, r: EngineRequest, started: asyncio.Event) -> list[EngineOutput]:
    outs = []
    async for out in engine.generate(r):
        outs.append(out)
        started.set()
    return outs


async def test_two_tenants_run_one_request_id_and_an_abort_ends_only_its_own():
    engine = SimEngine(PROFILES["llama-8b-h100"])          # ~7 ms a decode step: both overlap
    await engine.start()
    try:
        acme_started, globex_started = asyncio.Event(), asyncio.Event()
        acme = asyncio.create_task(collect(engine, request("acme", 60), acme_started))
        globex = asyncio.create_task(collect(engine, request("globex", 400), globex_started))
        await asyncio.wait_for(asyncio.gather(acme_started.wait(), globex_started.wait()), 10)
        assert engine.num_running() == 2
        await engine.abort(RequestKey("globex", "same-id"))
        globex_outs, acme_outs = await globex, await acme
        assert globex_outs[-1].finish_reason == "abort"
        assert globex_outs[-1].completion_tokens < 400
        assert acme_outs[-1].finish_reason == "length"
        assert acme_outs[-1].completion_tokens == 60
        assert engine.num_running() == 0
    finally:
        await engine.cleanup()


async def test_one_tenant_cannot_run_one_request_id_twice():
    engine = SimEngine(PROFILES["llama-8b-h100"])
    await engine.start()
    try:
        started = asyncio.Event()
        first = asyncio.create_task(collect(engine, request("acme", 30), started))
        await asyncio.wait_for(started.wait(), 10)
        with pytest.raises(EngineError, match="already running"):
            await collect(engine, request("acme", 30), asyncio.Event())
        assert (await first)[-1].completion_tokens == 30
    finally:
        await engine.cleanup()
