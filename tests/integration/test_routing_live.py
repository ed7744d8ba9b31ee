"""Routing rules applied live through the whole path: tiers and `auto` reach their pools, a pool
that goes down spills to the hosted pool (counted as fallback), and the admin API changes rules
without a restart."""

from __future__ import annotations

import hashlib
import json

import aiohttp
import pytest

from bridge.admin import AdminConfig
from core.routing.rules import decode
from core.routing.store import RuleStore
from loadtest.stack import Stack, demo_settings
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY = "sk-routing"
ADMIN_KEY = "admin-secret"

RULES = {
    "pools": {
        "small": {"cost_in_per_1m": 0.05, "cost_out_per_1m": 0.10},
        "large": {"cost_in_per_1m": 0.60, "cost_out_per_1m": 1.20},
        "hosted": {"hosted": True, "cost_in_per_1m": 3.0, "cost_out_per_1m": 6.0},
    },
    "rules": [
        {"rule_id": "auto-code", "match": {"model": "auto", "intent": "code"}, "pools": {"large": 1}},
        {"rule_id": "auto-complex", "match": {"model": "auto", "intent": "complex"}, "pools": {"large": 1}},
        {"rule_id": "auto", "match": {"model": "auto"}, "pools": {"small": 1}},
        {"rule_id": "fast", "match": {"model": "fast"}, "pools": {"small": 1}},
        {"rule_id": "balanced", "match": {"model": "balanced"}, "pools": {"small": 1, "large": 1}},
        {"rule_id": "quality", "match": {"model": "quality"}, "pools": {"large": 1}},
    ],
}


def served_by(stack, pool: str) -> float:
    worker = next(w for w in stack.workers if w.config.pool == pool)
    return sum(s.value for m in worker.metrics.finished.collect() for s in m.samples if s.name.endswith("_total"))


@pytest.fixture(scope="module")
async def stack(nats_server):
    admin = AdminConfig((hashlib.sha256(ADMIN_KEY.encode()).hexdigest(),))
    engines = [SimEngine(PROFILES["zero"]) for _ in range(3)]
    async with Stack(
        nats_server.url,
        demo_settings(KEY, pool="small"),
        engines=engines,
        pools=["small", "large", "hosted"],
        prefix="rt",
        admin=admin,
    ) as s:
        store = await RuleStore.open(s.broker._nc.jetstream(), s.broker.s)
        await store.put(decode(json.dumps(RULES).encode()), expected_version=0)
        assert await eventually(lambda: s.broker.live.rules is not None and s.bridge.rules is not None), (
            "the rules never reached the broker and the bridge"
        )
        yield s


async def chat(stack, model: str, content: str = "What is 2+2?") -> dict:
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": content}]},
        ) as resp:
            return {"status": resp.status, "body": await resp.json()}


async def test_tiers_and_auto_reach_their_pools(stack):
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}) as resp:
            names = {m["id"] for m in (await resp.json())["data"]}
    assert {"fast", "balanced", "quality", "auto"} <= names
    small, large = served_by(stack, "small"), served_by(stack, "large")
    assert (await chat(stack, "fast"))["status"] == 200
    assert served_by(stack, "small") == small + 1
    assert (await chat(stack, "quality"))["status"] == 200
    assert served_by(stack, "large") == large + 1
    code = "Write a Python function that parses a CSV file and returns a list of dicts, with tests."
    assert (await chat(stack, "auto", code))["status"] == 200
    assert served_by(stack, "large") == large + 2
    assert (await chat(stack, "auto", "What is the capital of France?"))["status"] == 200
    assert served_by(stack, "small") == small + 2


async def test_a_pool_that_goes_down_spills_to_the_hosted_pool(stack):
    small_worker = next(w for w in stack.workers if w.config.pool == "small")
    hosted_before = served_by(stack, "hosted")
    fallback = stack.broker.metrics.routing_fallback
    await small_worker.stop()  # its last heartbeat says `stopping`

    def small_down() -> bool:
        health = stack.broker.live.pool_health.get("small")
        return not health or not health.ready_workers

    assert await eventually(small_down), "the broker never saw the small pool go down"
    result = await chat(stack, "fast")
    assert result["status"] == 200
    assert served_by(stack, "hosted") == hosted_before + 1
    assert fallback.labels("hosted", "spill_down")._value.get() >= 1


async def test_admin_api_changes_rules_live_and_refuses_tenant_keys(stack):
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.get("/v1/admin/routing", headers={"Authorization": f"Bearer {KEY}"}) as resp:
            assert resp.status == 401
            assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
        async with http.get("/v1/admin/routing", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as resp:
            assert resp.status == 200
            current = await resp.json()
    assert current
