"""Stored responses under `laneway up` with the PII stage on (regex): what the store holds of a
tenant's input is the input as the tenant's policy let it reach the model, read back over HTTP
(input_items), as the ops NATS user from the bucket itself, and in no file once the run is over;
the tenant's own generated NATS user can neither read nor write the bucket."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import openai
import pytest

from loadtest.processes import LanewayUp
from schemas.subjects import stored_response_key
from tests.nats_refusals import every_message
from tests.wait import eventually

KEY = "sk-stored-up"
EMAIL, SSN = "grace.hopper@example.com", "536-22-8726"
ASK = f"Email {EMAIL} the form for SSN {SSN}, please."
STREAM, BUCKET = "KV_lw_responses", "lw_responses"

pytestmark = pytest.mark.timeout(180)


async def _retrieved(client: openai.AsyncOpenAI, response_id: str, ended: bool = False):
    found = []

    async def got() -> bool:
        try:
            found.append(await client.responses.retrieve(response_id))
        except openai.NotFoundError:
            return False
        return not ended or found[-1].status not in ("queued", "in_progress")

    assert await eventually(got)
    return found[-1]


async def _violations_of(up: LanewayUp, count: int) -> list[str]:
    log = up.data_dir / "nats" / "nats-server.log"
    lines: list[str] = []

    def logged() -> bool:
        lines[:] = [line for line in log.read_text().splitlines() if " Violation - " in line]
        return len(lines) >= count

    assert await eventually(logged, timeout=30), lines
    return lines


async def test_the_store_holds_the_redacted_input_and_tenants_cannot_reach_it(tmp_path):
    data = tmp_path / "lw"
    async with LanewayUp(data, KEY, ["--pii", "regex", "--sim-profile", "zero", "--background-lease", "3"]) as up:
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0)
        first = await client.responses.create(model="laneway-sim", input=ASK, max_output_tokens=4)
        await _retrieved(client, first.id)
        second = await client.responses.create(
            model="laneway-sim", input=f"And copy {EMAIL} too.", previous_response_id=first.id, max_output_tokens=4
        )
        await _retrieved(client, second.id)

        background = await client.responses.create(
            model="laneway-sim", input=f"Write to {EMAIL}.", background=True, max_output_tokens=4
        )
        assert background.status == "queued"
        assert (await _retrieved(client, background.id, ended=True)).status == "incomplete"  # its 4 tokens

        # Over HTTP: the input items are the redacted input.
        [item] = (await client.responses.input_items.list(first.id)).data
        text = item.content[0].text
        assert "<EMAIL_ADDRESS>" in text and "<US_SSN>" in text and EMAIL not in text and SSN not in text

        # In the bucket, read as ops: every message of the stream, not only the latest revisions.
        ops = await up.connect_nats("ops")
        try:
            js = ops.jetstream()
            stored = [
                (await js.get_last_msg(STREAM, f"$KV.{BUCKET}.{stored_response_key('demo', r.id)}")).data
                for r in (first, second)
            ]
            every = await every_message(js, STREAM)
        finally:
            await ops.close()
        assert all(b"<EMAIL_ADDRESS>" in data and b"<US_SSN>" in data for data in stored)  # history too
        assert not any(EMAIL.encode() in data or SSN.encode() in data for data in every)

        # The tenant's own NATS user: no JetStream API, no bucket subject, either way.
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        demo = await up.connect_nats("tenant-demo", inbox_prefix="_INBOX_demo", error_cb=on_error)
        try:
            with pytest.raises((nats.errors.Error, nats.js.errors.Error)):
                await demo.jetstream().get_last_msg(STREAM, f"$KV.{BUCKET}.demo.{first.id}")
            seen: list = []

            async def keep(msg) -> None:
                seen.append(msg)

            await demo.subscribe(f"$KV.{BUCKET}.>", cb=keep)
            await demo.publish(f"$KV.{BUCKET}.demo.{first.id}", b"overwritten")
            await demo.flush()
            assert await eventually(lambda: len(errors) >= 2, timeout=10), errors
            assert seen == []
        finally:
            await demo.close()
        lines = await _violations_of(up, 3)
        assert all('user:tenant-demo"' in line for line in lines), lines  # no service was refused
        assert (await client.responses.retrieve(first.id)).output_text == first.output_text
        await client.close()
    # Nothing of the raw values at rest, anywhere under the data dir (JetStream's files, logs).
    leaks = [
        p
        for p in data.rglob("*")
        if p.is_file() and (EMAIL.encode() in p.read_bytes() or SSN.encode() in p.read_bytes())
    ]
    assert leaks == []
