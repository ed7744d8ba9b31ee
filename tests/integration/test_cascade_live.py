"""The cascade on the live path: `auto` tries the small pool; when the first tokens' mean
log-probability is low, nothing is released and the large pool answers instead, in one
uninterrupted stream."""

from __future__ import annotations

import json

import aiohttp
import pytest

from core.routing.rules import decode
from core.routing.store import RuleStore
from loadtest.stack import Stack, demo_settings
from tests.wait import eventually
from workers.engine import EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY = "sk-cascade"

RULES = {
    "pools": {"small": {"cost_out_per_1m": 0.1}, "large": {"cost_out_per_1m": 1.2}},
    "rules": [
        {"rule_id": "auto", "match": {"model": "auto"}, "pools": {"small": 1}, "escalate_to": "large"},
        {"rule_id": "quality", "match": {"model": "quality"}, "pools": {"large": 1}},
    ],
    "models": ["auto", "quality"],
    "cascade": {"window": 3, "min_mean_logprob": -1.0},
}


class UnsureOnHardPrompts(SimEngine):
    """A SIMULATED small model: confident, except on prompts marked HARD."""

    def confidence(self, request: EngineRequest) -> float:
        return -1.8 if any("HARD" in t for t in request.body.texts()) else -0.2


@pytest.fixture(scope="module")
async def stack(nats_server):
    engines = [UnsureOnHardPrompts(PROFILES["zero"]), SimEngine(PROFILES["zero"])]
    async with Stack(
        nats_server.url, demo_settings(KEY, pool="small"), engines=engines, pools=["small", "large"], prefix="cas"
    ) as s:
        store = await RuleStore.open(s.broker._nc.jetstream(), s.broker.s)
        await store.put(decode(json.dumps(RULES).encode()), expected_version=0)
        assert await eventually(lambda: s.broker.live.rules is not None and s.bridge.rules is not None), (
            "the rules never reached the broker and the bridge"
        )
        yield s


async def stream(stack, content: str) -> tuple[str, list[str]]:
    body = {"model": "auto", "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200
            # Each event's data line (an `id:` line may come first: docs/openai-api.md, "Resuming a stream").
            events = [e.split("\n")[-1] for e in (await r.text()).split("\n\n") if e]
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
        for e in events
        if e.startswith("data: {") and '"choices":[{' in e
    )
    return text, events


async def test_confident_answers_stay_on_the_small_pool(stack):
    small, large = stack.finished("small"), stack.finished("large")
    text, events = await stream(stack, "What is 2 + 2?")
    assert len(text.split()) == 8 and events[-1] == "data: [DONE]"
    assert stack.finished("small") == small + 1 and stack.finished("large") == large


async def test_unsure_answers_escalate_to_the_large_pool_in_one_stream(stack):
    small_worker = next(w for w in stack.workers if w.config.pool == "small")
    escalations = small_worker.metrics.escalations.labels("small")
    before, large = escalations._value.get(), stack.finished("large")
    text, events = await stream(stack, "HARD: prove the Riemann hypothesis")
    assert len(text.split()) == 8, text  # the large pool's whole answer, nothing twice
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    assert escalations._value.get() == before + 1
    assert stack.finished("large") == large + 1
    decisions = stack.broker.metrics.routing_decisions.labels("large", "escalated")._value.get()
    assert decisions >= 1
