"""Prefix-cache hits end to end, with the official `openai` client: bridge + broker + sim worker
on a real nats-server. A repeated long prompt is answered partly from the engine's prefix cache
and says so in `usage.prompt_tokens_details.cached_tokens`, and its usage record meters it; the
same prompt from another tenant finds nothing (the cache salt is per tenant scope)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import nats
import openai
import pytest

from core.usage_log import read_usage
from loadtest.stack import Stack, demo_settings
from schemas.subjects import Subjects
from tests.wait import eventually

KEY, OTHER_KEY = "sk-test-prefix-demo", "sk-test-prefix-other"
# ~1,000 prompt tokens: dozens of full KV blocks. No temperature: the response cache (deterministic
# requests only) never answers these, so every request reaches the engine.
PROMPT = "You are the support agent of a parcel company. Answer in two short sentences. " * 50


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY, extra_tenants={"other": OTHER_KEY})) as s:
        yield s


def client_for(stack: Stack, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


async def ask(client: openai.AsyncOpenAI, question: str, stream: bool) -> openai.types.CompletionUsage:
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": question}]
    if not stream:
        completion = await client.chat.completions.create(model="laneway-sim", messages=messages, max_tokens=4)
        return completion.usage
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="laneway-sim", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    ]
    return chunks[-1].usage


async def test_a_repeated_prompt_is_read_from_the_prefix_cache_per_tenant(stack, nats_server) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    demo, other = client_for(stack, KEY), client_for(stack, OTHER_KEY)
    first = await ask(demo, "Where is my parcel?", stream=False)
    assert first.prompt_tokens > 500 and first.prompt_tokens_details.cached_tokens == 0

    again = await ask(demo, "Can I change the address?", stream=False)  # the same long prefix
    assert 0 < again.prompt_tokens_details.cached_tokens < again.prompt_tokens
    streamed = await ask(demo, "Where is my parcel?", stream=True)
    assert streamed.prompt_tokens_details.cached_tokens > 0

    # Another tenant, the very same prompt: its cache scope is its own, so nothing is shared.
    theirs = await ask(other, "Where is my parcel?", stream=False)
    assert theirs.prompt_tokens == first.prompt_tokens and theirs.prompt_tokens_details.cached_tokens == 0

    # Metered: the tenant's usage records carry the hits the client was told about.
    told = again.prompt_tokens_details.cached_tokens + streamed.prompt_tokens_details.cached_tokens
    nc = await nats.connect(nats_server.url)
    try:

        async def metered(tenant: str) -> list[int]:
            return [
                u.cached_tokens async for u in read_usage(nc.jetstream(), Subjects("lw"), tenant, since, idle_timeout=2)
            ]

        async def recorded() -> bool:
            mine, theirs = await metered("demo"), await metered("other")
            return len(mine) == 3 and sum(mine) == told and theirs == [0]

        assert await eventually(recorded)
    finally:
        await nc.close()
    # The worker's counters behind the board's hit rate per pool.
    registry = stack.workers[0].metrics.registry
    labels = {"pool": "sim", "class": "interactive"}
    assert registry.get_sample_value("laneway_worker_cached_prompt_tokens_total", labels) == told
    assert registry.get_sample_value("laneway_worker_prompt_tokens_total", labels) == sum(
        u.prompt_tokens for u in (first, again, streamed, theirs)
    )
