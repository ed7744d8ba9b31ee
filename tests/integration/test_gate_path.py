"""The admission gate on the whole path (bridge → broker gate → worker): quotas answer 429 with
rate-limit headers, a deterministic answer is replayed from the cache for the same tenant only,
PII is redacted before the engine sees it or blocked by policy, and every finished request is
metered on LW_USAGE."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import nats
import nats.js.errors
import pytest

from core.policy.pii import Action, TenantPiiPolicy
from core.policy.quota import QuotaPolicy
from core.policy.tenants import Tenant, hash_key
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack
from schemas import codec
from tests.clock import Clock
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEYS = {"acme": "sk-acme", "globex": "sk-globex", "tight": "sk-tight", "strict": "sk-strict"}


class RecordingEngine(SimEngine):
    """The sim engine, remembering what reached it (to prove redaction happened upstream)."""

    def __init__(self) -> None:
        super().__init__(PROFILES["zero"])
        self.seen: list[str] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.seen.append(" ".join(request.body.texts()))
        async for out in super().generate(request):
            yield out


def settings() -> Settings:
    tenants = {
        "acme": Tenant(name="acme", api_key_sha256=[hash_key(KEYS["acme"])]),
        "globex": Tenant(name="globex", api_key_sha256=[hash_key(KEYS["globex"])]),
        "tight": Tenant(name="tight", api_key_sha256=[hash_key(KEYS["tight"])], quota=QuotaPolicy(requests_per_min=3)),
        "strict": Tenant(
            name="strict",
            api_key_sha256=[hash_key(KEYS["strict"])],
            pii=TenantPiiPolicy(entities={"US_SSN": Action.block}),
        ),
    }
    return Settings(tenants=tenants, models={"laneway-sim": LogicalModel(pool="sim")})


@pytest.fixture(scope="module")
async def stack(nats_server):
    engine = RecordingEngine()
    async with Stack(nats_server.url, settings(), engines=[engine], prefix="gate", pii="regex") as s:
        yield s


async def chat(stack, tenant: str, content: str, **extra) -> tuple[int, dict, dict]:
    body = {"model": "laneway-sim", "max_tokens": 6, "messages": [{"role": "user", "content": content}], **extra}
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        async with http.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
        ) as resp:
            return resp.status, await resp.json(), dict(resp.headers)


async def test_quota_over_the_rate_is_429_with_rate_limit_headers(stack, monkeypatch):
    # All five requests in one minute window: its edge is 55 s away, not wherever the real clock is.
    monkeypatch.setattr(stack.broker.gate.quota, "_clock", Clock.early_in_this_minute())
    statuses, remaining = [], []
    for _ in range(5):
        status, body, headers = await chat(stack, "tight", "hello")
        statuses.append(status)
        remaining.append(headers.get("x-ratelimit-remaining-requests"))
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429]
    # Successful answers say where the tenant stands too (OpenAI sends these on every answer).
    assert remaining[:3] == ["2", "1", "0"]
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "rate_limit_exceeded"
    assert int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "3" and headers["x-ratelimit-remaining-requests"] == "0"


async def cache_entries(stack) -> int:
    info = await stack.broker._nc.jetstream().stream_info(f"KV_{stack.broker.s.bucket('cache')}")
    return info.state.messages


async def test_deterministic_answer_is_replayed_from_the_cache_for_that_tenant_only(stack):
    prompt = "What is the capital of France? (cache test)"
    entries = await cache_entries(stack)
    status, first, _ = await chat(stack, "acme", prompt, temperature=0)
    assert status == 200

    # the answer is stored in the background: wait until its entry is in the bucket
    async def stored() -> bool:
        return await cache_entries(stack) > entries

    assert await eventually(stored), "the answer was never cached"
    before = stack.finished()
    status, again, _ = await chat(stack, "acme", prompt, temperature=0)
    assert status == 200 and again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert stack.finished() == before, "a cache hit must not reach the engine"
    status, _other, _ = await chat(stack, "globex", prompt, temperature=0)
    assert status == 200 and stack.finished() == before + 1, "another tenant must not hit acme's entry"
    await chat(stack, "acme", prompt, temperature=0.7)  # not deterministic: never cached
    assert stack.finished() == before + 2


async def test_pii_is_redacted_before_the_engine_and_blocked_by_policy(stack):
    engine: RecordingEngine = stack.workers[0].engine
    status, _, _ = await chat(stack, "acme", "Email me at jane.doe@example.com about the invoice")
    assert status == 200
    assert "jane.doe@example.com" not in engine.seen[-1] and "invoice" in engine.seen[-1]
    status, body, _ = await chat(stack, "strict", "My SSN is 536-22-8741, update my file")
    assert status == 400 and body["error"]["code"] == "pii_blocked"
    assert "US_SSN" in body["error"]["message"] and "536-22-8741" not in body["error"]["message"]
    assert all("536-22-8741" not in seen for seen in engine.seen)


async def test_pii_findings_are_audited_without_values(stack, nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        sub = await js.subscribe("gate.audit.acme", stream="GATE_AUDIT", ordered_consumer=True)
        await chat(stack, "acme", "Call me on 212-555-0134 please")
        records = []
        while not any(b"PHONE_NUMBER" in m.data for m in records):  # until this request's record
            records.append(await sub.next_msg(timeout=30))
        raw = b"".join(m.data for m in records)
        assert b"212-555-0134" not in raw
    finally:
        await nc.close()


async def test_every_finished_request_is_metered(stack, nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        _status, body, _ = await chat(stack, "globex", "meter me")

        async def metered() -> bool:  # the usage record comes after the answer, in the background
            try:
                msg = await js.get_last_msg("GATE_USAGE", "gate.usage.globex")
            except nats.js.errors.NotFoundError:
                return False
            return f"chatcmpl-{codec.decode_usage(msg.data).request_id}" == body["id"]

        assert await eventually(metered), "the request was never metered"
        msg = await js.get_last_msg("GATE_USAGE", "gate.usage.globex")
        usage = codec.decode_usage(msg.data)
        assert usage.tenant == "globex" and usage.completion_tokens == 6 and not usage.cached
        assert f"chatcmpl-{usage.request_id}" == body["id"]
    finally:
        await nc.close()
