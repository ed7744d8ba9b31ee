"""KV-aware dispatch where users meet it: `laneway up` and a second worker, a conversation of several turns
with the official `openai` client. Each turn re-sends the history; with prefix affinity it lands
on the worker that computed that history, so the engine reports the previous turn's whole prompt
as read from its prefix cache (`usage.prompt_tokens_details.cached_tokens`). Another tenant's
identical conversation shares nothing: the index and the engines' caches are salted per tenant.

Without affinity (checked by hand with `--no-prefix-affinity`: 0 of 7 turns found their history)
the two workers' parked pulls take turns, and each turn lands where its history is not."""

from __future__ import annotations

import itertools
import random

import aiohttp
import openai
import pytest
import pytest_asyncio

from core.promtext import parse
from loadtest.fleet import Fleet
from loadtest.processes import metrics_port
from loadtest.scenarios import PoolSpec, TenantSpec
from loadtest.sessions import prose, system_prompt

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

TURNS = 8
BLOCK = 16  # the sim's KV block: the part of a prompt that can never be a full cached block


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory):
    tenants = [TenantSpec("acme"), TenantSpec("other")]
    async with Fleet(
        tmp_path_factory.mktemp("affinity") / "lw",
        tenants,
        [PoolSpec(workers=2)],
        up_flags=["--pii", "off", "--metrics"],
    ) as running:
        yield running


def client(fleet: Fleet, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key=fleet.keys[tenant], max_retries=0)


async def converse(client: openai.AsyncOpenAI, tag: str) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each turn of one conversation."""
    rng = random.Random(tag)
    messages = [{"role": "system", "content": system_prompt("acme", 1500)}]
    out = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": prose(rng, 120, f"[{tag} turn {turn}]")})
        reply = await client.chat.completions.create(
            model="laneway-sim", messages=messages, max_tokens=8, temperature=0.7
        )  # never the response cache
        usage = reply.usage
        out.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or "ok"})
    return out


async def test_each_turn_lands_where_its_history_is_cached(fleet: Fleet) -> None:
    turns = await converse(client(fleet, "acme"), "first")
    found = [cached >= previous - BLOCK for (previous, _), (_, cached) in itertools.pairwise(turns)]
    # One race is allowed: a worker's fresh pull may reach the broker after the next turn does.
    assert sum(found) >= TURNS - 2, turns


async def expected_cached(fleet: Fleet) -> float:
    """The prompt tokens the scheduler's index expected cached where it sent requests, so far."""
    [broker] = fleet.up.role_pids("broker")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{metrics_port(broker)}/metrics") as resp:
            return parse(await resp.text()).total("laneway_prefix_affinity_tokens_total")


async def test_another_tenant_shares_no_prefix(fleet: Fleet) -> None:
    """The same conversation from a second tenant: neither the engines' caches nor the scheduler's
    index know any of it (its placement reveals nothing of the first tenant's prompts); its own
    second turn still finds its own history."""
    before = await expected_cached(fleet)
    other = client(fleet, "other")
    rng = random.Random("first")  # the first tenant's very first turn, word for word
    first = await other.chat.completions.create(
        model="laneway-sim",
        max_tokens=8,
        temperature=0.7,
        messages=[
            {"role": "system", "content": system_prompt("acme", 1500)},
            {"role": "user", "content": prose(rng, 120, "[first turn 0]")},
        ],
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0, first.usage
    assert await expected_cached(fleet) == before
    turns = await converse(other, "second")
    assert turns[1][1] >= turns[0][0] - BLOCK, turns
