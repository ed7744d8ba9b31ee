"""LoRA adapters as logical models, where users meet them: `laneway up` and a second simulated
worker, a models table with two adapter models on the pool (each worker holds one adapter at a
time). `/v1/models` lists them; the official client is answered under the adapter's name; and
each adapter's requests go to the worker that holds it loaded, so after the first request of
each, nothing is loaded again (the usage records say which worker served what)."""

from __future__ import annotations

from datetime import UTC, datetime

import aiohttp
import openai
import pytest
import pytest_asyncio

from bridge.client import LanewayClient, LanewayError
from core.models import put_models
from core.settings import LogicalModel
from core.usage_log import read_usage
from loadtest.fleet import Fleet
from loadtest.scenarios import PoolSpec, TenantSpec
from schemas.subjects import Subjects
from tests.requests import chat
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

ADAPTERS = ("support-parcels", "support-billing")
# Not alternating: two workers' parked pulls take turns, so alternating requests would land on
# "their" worker by that alone (the test passed with --no-prefix-affinity that way).
ORDER = (0, 0, 1, 1, 0, 1, 1, 0, 0, 1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory):
    pool = PoolSpec(workers=2, adapters=ADAPTERS, max_loras=1, lora_load_s=0.05)
    async with Fleet(
        tmp_path_factory.mktemp("adapters") / "lw", [TenantSpec("acme")], [pool], up_flags=["--pii", "off"]
    ) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def private_fleet(tmp_path_factory):
    """Two tenants; acme's own adapter model added to the models table live, as an operator would."""
    async with Fleet(
        tmp_path_factory.mktemp("private") / "lw",
        [TenantSpec("acme"), TenantSpec("globex")],
        [PoolSpec()],
        up_flags=["--pii", "off"],
    ) as running:
        nc = await running.up.connect_nats("ops")
        try:
            await put_models(
                nc.jetstream(),
                Subjects(),
                {
                    "laneway-sim": LogicalModel(pool="sim"),
                    PRIVATE: LogicalModel(pool="sim", adapter="/adapters/acme", tenants=["acme"]),
                },
            )
        finally:
            await nc.close()
        owner = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key=running.keys["acme"], max_retries=0)

        async def applied() -> bool:
            return PRIVATE in {m.id async for m in owner.models.list()}

        assert await eventually(applied)
        yield running


def client(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key=fleet.keys["acme"], max_retries=0)


async def test_adapters_are_listed_as_models(fleet: Fleet) -> None:
    listed = {m.id async for m in client(fleet).models.list()}
    assert set(ADAPTERS) | {"laneway-sim"} <= listed


async def test_each_adapter_stays_on_the_worker_that_holds_it(fleet: Fleet) -> None:
    since = datetime.now(UTC)
    ids: dict[str, str] = {}
    c = client(fleet)
    for n, which in enumerate(ORDER):
        model = ADAPTERS[which]
        reply = await c.chat.completions.create(
            model=model, max_tokens=4, temperature=0.7, messages=[{"role": "user", "content": f"question {n}"}]
        )
        assert reply.model == model and reply.choices[0].message.content
        ids[reply.id] = model
    nc = await fleet.up.connect_nats("ops")
    try:
        records: list = []

        async def all_metered() -> bool:
            records[:] = [u async for u in read_usage(nc.jetstream(), Subjects(), "acme", since, idle_timeout=2)]
            return len(records) >= len(ids)

        assert await eventually(all_metered)
    finally:
        await nc.close()
    workers = {model: {u.worker_id for u in records if u.model == model} for model in ADAPTERS}
    # One worker each, and not the same one: with one adapter slot per worker, any other
    # placement would load an adapter again (and in a real engine, stall that worker's step).
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers[ADAPTERS[0]] != workers[ADAPTERS[1]], workers


PRIVATE = "acme-finetune"  # a tenant's own adapter: for every other tenant it does not exist


async def test_a_private_model_does_not_exist_for_another_tenant(private_fleet: Fleet) -> None:
    """Over HTTP: not listed, not found, not in the spec; over NATS with the tenant's generated
    credentials, the broker refuses it as the bridge does."""
    owner = openai.AsyncOpenAI(base_url=f"{private_fleet.url}/v1", api_key=private_fleet.keys["acme"], max_retries=0)
    other = openai.AsyncOpenAI(base_url=f"{private_fleet.url}/v1", api_key=private_fleet.keys["globex"], max_retries=0)
    assert PRIVATE in {m.id async for m in owner.models.list()}
    reply = await owner.chat.completions.create(
        model=PRIVATE, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.model == PRIVATE
    assert PRIVATE not in {m.id async for m in other.models.list()}
    with pytest.raises(openai.NotFoundError) as refused:
        await other.chat.completions.create(model=PRIVATE, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        await other.models.retrieve(PRIVATE)
    async with aiohttp.ClientSession() as http:  # the unauthenticated spec does not name it
        async with http.get(f"{private_fleet.url}/openapi.json") as resp:
            assert PRIVATE not in await resp.text()
    nc = await private_fleet.up.connect_nats("tenant-globex")
    try:
        async with LanewayClient(nc, "globex") as direct:
            body = chat("hi", model=PRIVATE, max_tokens=2)
            with pytest.raises(LanewayError) as err:
                await direct.generate(body, klass="interactive").__anext__()
        assert err.value.code == "unknown_model", err.value
    finally:
        await nc.close()
