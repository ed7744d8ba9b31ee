"""A batch's lines pass the same gate as any request, under `laneway up` with the PII stage on:
a line's email address is redacted before the engine and audited (never the raw value), and
metering prices each line at the batch price (the price book's `class_fraction`), the usage
record naming the `batch` class."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
import openai
import pytest

from broker.gate.pii.audit import PiiAudit
from core.metering import PRICES_KEY
from core.usage_log import read_usage
from loadtest.fleet import Fleet
from loadtest.scenarios import PoolSpec, TenantSpec
from schemas.subjects import Subjects
from tests.e2e.test_batch_durability import ended
from tests.e2e.test_batches_api import chat_line, jsonl
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

S = Subjects()
EMAIL = "maria.garcia@example.com"
PRICES = {"pools": {"sim": {"usd_per_1m_prompt": 2.0, "usd_per_1m_completion": 8.0}}, "class_fraction": {"batch": 0.5}}


def full_price(prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * 2.0 + completion_tokens * 8.0) / 1e6


async def test_batch_lines_are_redacted_audited_and_metered_at_the_batch_price(tmp_path) -> None:
    async with Fleet(
        tmp_path / "lw", [TenantSpec("acme")], [PoolSpec(profile="zero")], up_flags=["--pii", "regex"]
    ) as f:
        since = datetime.now(UTC)
        ops = await f.up.connect_nats("ops")
        try:
            js = ops.jetstream()
            await (await js.key_value(S.bucket("routing"))).put(PRICES_KEY, json.dumps(PRICES).encode())
            c = openai.AsyncOpenAI(base_url=f"{f.url}/v1", api_key=f.keys["acme"], max_retries=0)

            async def priced() -> bool:  # the workers have the price book once a chat is priced
                reply = await c.chat.completions.create(
                    model="laneway-sim", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
                )
                records = [
                    u
                    async for u in read_usage(js, S, "acme", since)
                    if u.request_id == reply.id or reply.id.endswith(u.request_id)
                ]
                return any(u.cost_usd > 0 for u in records)

            assert await eventually(priced, timeout=60)

            lines = [chat_line("pii", f"Write to {EMAIL} about the refund"), chat_line("plain", "Say hello")]
            file = await c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
            batch = await c.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = await ended(c, batch.id)
            assert done.status == "completed" and done.request_counts.completed == 2

            mine = [u async for u in read_usage(js, S, "acme", since) if u.request_id.startswith(batch.id)]
            assert len(mine) == 2 and {u.klass for u in mine} == {"batch"}
            for u in mine:
                assert u.cost_usd == pytest.approx(0.5 * full_price(u.prompt_tokens, u.completion_tokens))

            sub = await js.subscribe(S.audit("acme"), stream=S.audit_stream, ordered_consumer=True)
            audits = []
            try:

                async def audited() -> bool:
                    msg = await sub.next_msg(timeout=10)
                    assert EMAIL.encode() not in msg.data
                    audits.append(msgspec.msgpack.decode(msg.data, type=PiiAudit))
                    return any(a.request_id.startswith(batch.id) for a in audits)

                assert await eventually(audited, timeout=60, interval=0)
            finally:
                await sub.unsubscribe()
            line_audit = next(a for a in audits if a.request_id.startswith(batch.id))
            assert line_audit.action == "redacted" and "EMAIL_ADDRESS" in line_audit.entity_types
        finally:
            await ops.close()
