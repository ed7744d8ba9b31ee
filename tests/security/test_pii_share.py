"""One tenant cannot take the PII stage from the others, on `laneway up`.

Before, the analyzer pool was one FIFO queue for every tenant, and a request's text was cut into
a job per process: a tenant publishing many large prompts had every process busy and every
other tenant's analysis queued behind its whole flood (a noisy-neighbour denial of service on
the gate), and a text of any size was analysed. Now each tenant's jobs hold at most its share of
the pool (half the processes, rounded up), and a request with more text than the broker
analyses (`--pii-max-chars`, 256 Ki characters by default; 100,000 here) is refused with 413
`pii_too_large` before any analysis.

The flood is acme's, published past the bridge with its own NATS user, every prompt dense with
phone numbers and addresses (the costliest text for the recognizers). Who got through the PII
stage, and in which order, is read from `LW_AUDIT`: the gate writes each request's findings
there as its analysis ends. What an engine receives is read where an engine reads it: the
batch a pull of the worker protocol answers, in a class no real worker takes.
"""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import msgspec
import pytest

from broker.gate.pii import decode_audit
from loadtest.processes import LanewayUp
from tests.requests import chat
from tests.security.conftest import KEYS
from tests.security.engine_view import first_dispatched_prompt
from tests.security.publisher import Publisher, S
from tests.security.test_reply_subjects import stream_messages
from tests.wait import eventually

pytestmark = pytest.mark.timeout(600)

MAX_CHARS = 100_000  # --pii-max-chars: the flood's prompts (~8,000 characters each) are under it
FLOOD = 16  # acme's prompts, each a few hundred milliseconds of analysis
EMAIL = "maria.garcia@example.com"
# Both policies wait long for the pool: a request of acme's queued behind its own flood must not
# fail for its timeout, and globex's must not fail for waiting behind acme's.
SETTINGS = f"""
[tenants.acme]
api_key_sha256 = ["{hashlib.sha256(KEYS["acme"].encode()).hexdigest()}"]
pii = {{ timeout_ms = 30000 }}

[tenants.globex]
api_key_sha256 = ["{hashlib.sha256(KEYS["globex"].encode()).hexdigest()}"]
pii = {{ timeout_ms = 30000 }}

[models.laneway-sim]
pool = "sim"
"""


def dense(i: int, n: int = 450) -> str:
    """About 8,000 characters of phone numbers and IP addresses; `i` makes each text new (the
    gate caches what it analysed)."""
    return f"Flood {i}: write to {EMAIL}. " + " ".join(
        f"call {400 + k % 500}-555-{1000 + k:04d} or 10.{i % 250}.{k % 250}.{k % 200}" for k in range(n)
    )


@pytest.fixture(scope="module")
async def up(tmp_path_factory):
    root = tmp_path_factory.mktemp("pii-share")
    settings = root / "settings.toml"
    settings.write_text(SETTINGS)
    # Two processes: a share of one each. The sim worker takes interactive only: what the
    # broker admits in batch or standard waits for the test's own pulls.
    async with LanewayUp(
        root / "lw",
        KEYS["acme"],
        [
            "--settings",
            str(settings),
            "--pii-workers",
            "2",
            "--pii-max-chars",
            str(MAX_CHARS),
            "--classes",
            "interactive",
        ],
    ) as stack:
        yield stack


async def audits(js) -> list[tuple[str, str]]:
    """(tenant, request_id) of every audit record so far, in the order the gate wrote them."""
    return [(a.tenant, a.request_id) for a in map(decode_audit, await stream_messages(js, S.audit_stream))]


async def test_another_tenant_gets_through_the_pii_stage_while_one_floods_it(up):
    ops = await up.connect_nats("ops")
    acme_nc, globex_nc = await up.connect_nats("tenant-acme"), await up.connect_nats("tenant-globex")
    try:
        js = ops.jetstream()
        acme, globex = await Publisher(acme_nc, "acme").start(), await Publisher(globex_nc, "globex").start()
        flood = [msgspec.structs.replace(acme.request(), chat=chat(dense(i), max_tokens=4)) for i in range(FLOOD)]
        await asyncio.gather(*(acme.publish(r) for r in flood))
        # The flood is in the pool once its first analysis has ended.
        assert await eventually(lambda: _has(js, "acme"), timeout=120), "acme's flood was never analysed"

        quiet = msgspec.structs.replace(globex.request(), chat=chat(f"Please write back to {EMAIL}.", max_tokens=4))
        await globex.publish(quiet)
        assert await eventually(lambda: _has(js, "globex"), timeout=120), "globex never got through the PII stage"

        # Behind the flood, globex would come after all of it; beside it, after the few of acme's
        # jobs already in the pool (one per process of acme's share) while the rest still wait.
        written = await audits(js)
        before = written[: written.index(("globex", quiet.request_id))]
        flood_ids = {r.request_id for r in flood}
        analysed_first = len([rid for _, rid in before if rid in flood_ids])
        assert analysed_first < FLOOD // 2, (
            f"globex's request got through the PII stage only after {analysed_first} of acme's {FLOOD}"
        )
    finally:
        for nc in (ops, acme_nc, globex_nc):
            await nc.close()


async def _has(js, tenant: str) -> bool:
    return any(t == tenant for t, _ in await audits(js))


async def test_a_request_over_the_size_limit_is_refused_before_analysis_and_reaches_no_engine(up):
    huge = dense(0, n=9000)  # ~300,000 characters, in a tool's description:
    assert len(huge) > MAX_CHARS  # the context check counts only the messages
    tools = [{"type": "function", "function": {"name": "lookup", "description": huge}}]
    headers = {"Authorization": f"Bearer {KEYS['globex']}", "x-laneway-class": "standard"}
    async with aiohttp.ClientSession(base_url=up.url) as http:
        body = {
            "model": "laneway-sim",
            "max_tokens": 4,
            "tools": tools,
            "messages": [{"role": "user", "content": "Which order is late?"}],
        }
        async with http.post("/v1/chat/completions", json=body, headers=headers) as resp:
            status, answer = resp.status, await resp.json(content_type=None)
        assert status == 413, answer
        error = answer["error"]
        assert (error["code"], error["type"], error["param"]) == ("pii_too_large", "invalid_request_error", "tools")
        assert f"at most {MAX_CHARS}" in error["message"]

        # Refused for good: the next request the class's engine is handed is the one after it.
        marker = {"model": "laneway-sim", "max_tokens": 4, "messages": [{"role": "user", "content": "marker"}]}
        answer_task = asyncio.create_task(http.post("/v1/chat/completions", json=marker, headers=headers))
        try:
            assert await first_dispatched_prompt(up, "standard") == "marker"
        finally:
            answer_task.cancel()
            await asyncio.gather(answer_task, return_exceptions=True)
