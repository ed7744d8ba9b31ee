"""A background response outlives the bridge that runs it, under `laneway up`: that bridge
SIGKILLed (`up` restarts it, and the new one finds the response unrefreshed), or every process
stopped and started again on the same data directory (the bridge leaves it on its way out). Either
way it is generated again from its start and ends whole, as if nothing had happened. The sim
SIMULATES text: what is checked is the shape, and that the whole answer is one run's."""

from __future__ import annotations

import json
import os
import signal

import httpx
import openai
import pytest

from loadtest.fleet import Fleet, _role
from loadtest.scenarios import PoolSpec, TenantSpec
from tests.nats_refusals import assert_refused, every_message, violations
from tests.openapi import validator
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

# A real step time: 400 tokens take long enough to stop the bridge in the middle. A 1 s lease: a
# killed bridge's response reads stale after 4 s.
FLAGS = ["--pii", "off", "--background-lease", "1"]
POOL = PoolSpec(min_step_s=0.02)
TOKENS = 400
ASK = "Write the ticket's summary"


def fleet(path) -> Fleet:
    return Fleet(path, [TenantSpec("acme")], [POOL], up_flags=FLAGS)


def client(f: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{f.url}/v1", api_key=f.keys["acme"], max_retries=3)


async def status_is(c: openai.AsyncOpenAI, response_id: str, *statuses: str):
    seen = []

    async def reached() -> bool:
        try:
            seen.append(await c.responses.retrieve(response_id))
        except (openai.APIConnectionError, openai.InternalServerError):
            return False  # the bridge is being restarted
        return seen[-1].status in statuses

    assert await eventually(reached, timeout=120, interval=0.1)
    return seen[-1]


async def in_progress(c: openai.AsyncOpenAI) -> str:
    created = await c.responses.create(model="laneway-sim", input=ASK, background=True, max_output_tokens=TOKENS)
    await status_is(c, created.id, "in_progress")
    return created.id


async def assert_whole(f: Fleet, c: openai.AsyncOpenAI, response_id: str) -> None:
    done = await status_is(c, response_id, "completed", "incomplete", "failed", "cancelled")
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens", done
    assert done.usage.output_tokens == TOKENS and done.output_text
    async with httpx.AsyncClient(base_url=f.url, headers={"Authorization": f"Bearer {f.keys['acme']}"}) as http:
        validator("Response").validate((await http.get(f"/v1/responses/{response_id}")).json())
    [item] = (await c.responses.input_items.list(response_id)).data
    assert item.content[0].text == ASK
    assert violations(f.data_dir, "svc-") == []  # the takeover ran under the generated users


async def test_a_background_response_survives_its_bridge_killed(tmp_path) -> None:
    async with fleet(tmp_path / "lw") as f:
        c = client(f)
        response_id = await in_progress(c)
        await assert_only_bridges_hold_the_request(f)
        bridge = next(pid for pid in f.pids() if _role(pid) == "bridge")
        os.kill(bridge, signal.SIGKILL)
        await assert_whole(f, c, response_id)
        await assert_tenant_cannot_touch_the_list(f)


async def assert_only_bridges_hold_the_request(f: Fleet) -> None:
    """While it runs, its request is kept for another bridge in `lw_background`, which only bridges
    may read: the stored responses `ops` may read hold none of it (what is stored of an input is
    only what the PII stage let through), and `ops` is refused the list."""
    ops = await f.up.connect_nats("ops")
    try:
        stored = await every_message(ops.jetstream(), "KV_lw_responses")
    finally:
        await ops.close()
    assert stored and not any(ASK.encode() in data for data in stored)
    await assert_refused(
        f.up,
        "ops",
        ("$JS.API.STREAM.INFO.KV_lw_background", "$JS.API.DIRECT.GET.KV_lw_background.$KV.lw_background.acme.x"),
        "$KV.lw_background.>",
    )


async def assert_tenant_cannot_touch_the_list(f: Fleet) -> None:
    """The list of running background responses is the bridges' alone: a tenant that could delete
    its entry, or read others', is refused by the server (its account has no JetStream, and
    imports none of the bucket's subjects)."""
    await assert_refused(
        f.up,
        "tenant-acme",
        (
            "$JS.API.STREAM.INFO.KV_lw_background",
            "$JS.API.DIRECT.GET.KV_lw_background.$KV.lw_background.acme.x",
            "$KV.lw_background.acme.resp_x",
        ),
        "$KV.lw_background.>",
    )


async def test_a_background_response_survives_a_restart_of_every_process(tmp_path) -> None:
    data = tmp_path / "lw"
    async with fleet(data) as f:
        response_id = await in_progress(client(f))
    async with fleet(data) as f:  # the same data dir: its JetStream store, its credentials
        await assert_whole(f, client(f), response_id)


async def test_cancel_and_a_streamed_resume_under_laneway_up(tmp_path) -> None:
    """The official client's `responses.cancel` and `responses.retrieve(stream=True,
    starting_after=N)` against `laneway up`, each event checked against OpenAI's schema."""
    async with fleet(tmp_path / "lw") as f:
        c = client(f)
        stream = await c.responses.create(
            model="laneway-sim", input=ASK, background=True, stream=True, max_output_tokens=40
        )
        events = [e async for e in stream]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.incomplete"
        response_id = events[-1].response.id
        again = [e async for e in await c.responses.retrieve(response_id, stream=True, starting_after=3)]
        assert [e.model_dump() for e in again] == [e.model_dump() for e in events[4:]]
        async with httpx.AsyncClient(base_url=f.url, headers={"Authorization": f"Bearer {f.keys['acme']}"}) as http:
            raw = await http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": "-1"})
        blocks = [block for block in raw.text.split("\n\n") if block.strip()]
        assert len(blocks) == len(events)
        for block in blocks:
            validator("ResponseStreamEvent").validate(json.loads(block.split("\n")[1].removeprefix("data: ")))

        running = await in_progress(c)
        async with httpx.AsyncClient(base_url=f.url, headers={"Authorization": f"Bearer {f.keys['acme']}"}) as http:
            validator("Response").validate((await http.get(f"/v1/responses/{running}")).json())  # in progress
        assert (await c.responses.cancel(running)).status == "cancelled"
        assert (await c.responses.retrieve(running)).status == "cancelled"
