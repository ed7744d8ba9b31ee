"""An engine whose prefix cache every tenant shares (a hosted upstream behind one API key): its
hits are metered and priced, and never told to the client. An exact `cached_tokens` from a shared
cache would confirm a guess of another tenant's prompt (its system prompt and a customer's name)
block by block; the answer says 0 and the usage record keeps the real count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import nats
import openai
import pytest

from core.usage_log import read_usage
from loadtest.stack import Stack, demo_settings
from schemas.subjects import Subjects
from tests.wait import eventually
from workers.engines.openai.engine import OpenAIUpstreamEngine
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY, OTHER_KEY = "sk-shared-cache", "sk-shared-cache-other"
SECRET_PROMPT = "You are the assistant of ACME Bank. The customer is Jane Q. Example, account 4411. " * 30


class SharedCacheEngine(SimEngine):
    """The SIMULATED engine without cache salts: one prefix cache for every tenant, as a hosted
    upstream's is for one API key."""

    shared_prefix_cache = True

    def generate(self, request):
        request.cache_salt = ""
        return super().generate(request)


@pytest.fixture(scope="module")
async def stack(nats_server):
    settings = demo_settings(KEY, extra_tenants={"other": OTHER_KEY})
    async with Stack(nats_server.url, settings, engines=[SharedCacheEngine(PROFILES["zero"])], prefix="shc") as s:
        yield s


def test_the_hosted_upstream_engine_declares_its_cache_shared() -> None:
    assert OpenAIUpstreamEngine.shared_prefix_cache and not SimEngine.shared_prefix_cache


async def test_a_guess_of_another_tenants_prefix_is_not_confirmed(stack, nats_server) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    victim = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    attacker = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=OTHER_KEY, max_retries=0)
    messages = [{"role": "system", "content": SECRET_PROMPT}, {"role": "user", "content": "balance?"}]
    await victim.chat.completions.create(model="laneway-sim", messages=messages, max_tokens=2, temperature=0.5)
    guess = await attacker.chat.completions.create(
        model="laneway-sim", messages=messages, max_tokens=2, temperature=0.5
    )
    assert guess.usage.prompt_tokens_details.cached_tokens == 0  # the client learns nothing
    nc = await nats.connect(nats_server.url)
    try:

        async def metered() -> bool:  # ... and the engine's real hits are still metered
            records = [u async for u in read_usage(nc.jetstream(), Subjects("shc"), "other", since, idle_timeout=2)]
            return bool(records) and records[-1].cached_tokens > 0

        assert await eventually(metered)
    finally:
        await nc.close()
