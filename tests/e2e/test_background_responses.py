"""Background responses (`background: true`) end to end with the official `openai` client: answered
at once `queued`, generated with no client connection, polled to their end, cancelled, streamed
again from the store by `starting_after`, and run again by another bridge when the one running
it is gone (or failed, when its readers have seen output already).
Two pools: `sim` (zero delay) and `slow` (a simulated 8B model on an H100: long answers take
a while, so there is time to cancel one). The sim SIMULATES text: shapes, not words."""

from __future__ import annotations

import asyncio
import json

import httpx
import msgspec
import nats
import openai
import pytest

from bridge.app import Bridge
from bridge.config import BridgeConfig
from bridge.responses.stored.lifecycle import BRIDGE_LOST
from core.connect import NatsSettings
from core.settings import LogicalModel
from loadtest.stack import Stack, demo_settings
from schemas import codec, stored
from schemas.subjects import Subjects
from tests.openapi import validator
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY, OTHER_KEY = "sk-background", "sk-background-other"
# The second bridge's heartbeat: its records go stale soon after it is gone. (The record carries
# its writer's lease: the stack's own bridge keeps the default, so a CPU stall on a loaded machine
# never makes one of its healthy responses read as lost.)
LEASE_S = 0.2
LONG = 300  # output tokens: long enough to stop a bridge in the middle

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def stack(nats_server):
    settings = demo_settings(KEY, extra_tenants={"other": OTHER_KEY})
    settings = msgspec.structs.replace(settings, models={**settings.models, "slow": LogicalModel(pool="large")})
    async with Stack(
        nats_server.url,
        settings,
        engines=[SimEngine(PROFILES["zero"]), SimEngine(PROFILES["llama-8b-h100"])],
        pools=["sim", "large"],
    ) as s:
        yield s


@pytest.fixture
def client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)


async def _ends(
    client: openai.AsyncOpenAI, response_id: str, statuses=("completed", "incomplete", "failed", "cancelled")
):
    seen = []

    async def ended() -> bool:
        seen.append(await client.responses.retrieve(response_id))
        return seen[-1].status in statuses

    assert await eventually(ended, interval=0.1)
    return seen[-1]


def _cancelled(stack: Stack) -> float:
    worker = next(w for w in stack.workers if w.config.pool == "large")
    return (
        worker.metrics.registry.get_sample_value(
            "laneway_worker_finished_total", {"pool": "large", "reason": "cancelled"}
        )
        or 0.0
    )


async def test_a_background_response_is_answered_queued_and_polled_to_its_end(stack, client):
    created = await client.responses.create(model="laneway-sim", input="Say hello", background=True)
    assert created.background is True and created.status == "queued" and created.output == []
    done = await _ends(client, created.id)
    assert done.status == "completed" and done.output_text and done.background is True
    async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        validator("Response").validate((await http.get(f"/v1/responses/{created.id}")).json())
    [item] = (await client.responses.input_items.list(created.id)).data
    assert item.content[0].text == "Say hello"
    other = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        await other.responses.cancel(created.id)


async def test_cancel_stops_the_generation_and_marks_it_cancelled(stack, client):
    before = _cancelled(stack)
    created = await client.responses.create(
        model="slow", input="Write a long story", background=True, max_output_tokens=4000
    )
    await _ends(client, created.id, ("in_progress",))
    with pytest.raises(openai.BadRequestError) as err:  # nothing to continue from yet
        await client.responses.create(model="laneway-sim", input="and?", previous_response_id=created.id)
    assert err.value.body["param"] == "previous_response_id"
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert await eventually(lambda: _cancelled(stack) == before + 1)  # the engine stopped it
    assert (await client.responses.retrieve(created.id)).status == "cancelled"
    assert (await client.responses.cancel(created.id)).status == "cancelled"  # again: as it is
    plain = await client.responses.create(model="laneway-sim", input="hi")
    # Kept by a task of its own once answered (bridge/responses/routes.py): found, then refused.
    assert await eventually(lambda: _stored(client, plain.id))
    with pytest.raises(openai.BadRequestError):
        await client.responses.cancel(plain.id)  # only a background response can be


async def _stored(client: openai.AsyncOpenAI, response_id: str) -> bool:
    try:
        await client.responses.retrieve(response_id)
    except openai.NotFoundError:
        return False
    return True


async def test_a_streamed_background_response_resumes_from_the_store(stack, client):
    stream = await client.responses.create(model="laneway-sim", input="Say hello", background=True, stream=True)
    events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    response_id = events[-1].response.id
    resumed = await client.responses.retrieve(response_id, stream=True, starting_after=3)
    again = [e async for e in resumed]
    assert [e.sequence_number for e in again] == list(range(4, len(events)))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[4:]]
    async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        raw = await http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": "-1"})
    first = json.loads(raw.text.split("\n\n")[0].split("\n")[1][6:])
    assert first["type"] == "response.created" and first["sequence_number"] == 0


async def _on_a_second_bridge(stack: Stack, crash: bool) -> str:
    """A background response a second bridge runs, until it stops (crash: cut off from NATS first,
    so it can write nothing more, as if killed)."""
    config = BridgeConfig(nats=NatsSettings(url=stack.nats_url), port=0, background_lease_s=LEASE_S)
    async with Bridge(config, stack.settings) as doomed:
        await doomed.wait_ready()
        other_edge = openai.AsyncOpenAI(base_url=f"{doomed.url}/v1", api_key=KEY, max_retries=0)
        created = await other_edge.responses.create(
            model="slow", input="Write a long story", background=True, max_output_tokens=LONG
        )
        await _ends(other_edge, created.id, ("in_progress",))
        if crash:
            await doomed._nc.close()
    return created.id


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "cut-off"])
async def test_a_background_response_whose_bridge_went_away_is_run_again(stack, client, crash):
    """Stopped, the bridge leaves it at once; cut off, it stops refreshing it. Either way the
    stack's own bridge takes it over: the first generation stops, and the response is generated
    again from its start, whole (every output token its own run's: the limit, exactly)."""
    cancels = await nats.connect(stack.nats_url)
    cancelled: list[str] = []

    async def on_cancel(msg) -> None:
        cancelled.append(codec.decode_cancel(msg.data).request_id)

    await cancels.subscribe(Subjects().cancel("demo", "*"), cb=on_cancel)
    response_id = await _on_a_second_bridge(stack, crash)
    done = await _ends(client, response_id)
    # The first generation is told to stop (it may have ended already: the cancel is sent either way).
    assert await eventually(lambda: response_id.removeprefix("resp_") in cancelled)
    await cancels.close()
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens", done
    assert done.usage.output_tokens == LONG and done.output_text and done.background is True
    async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        validator("Response").validate((await http.get(f"/v1/responses/{response_id}")).json())
    [item] = (await client.responses.input_items.list(response_id)).data
    assert item.content[0].text == "Write a long story"


async def test_a_streamed_one_whose_readers_saw_output_fails_with_its_bridge(stack, client):
    """Its readers have seen tokens another run would not repeat: it cannot begin again, and ends
    failed, in-band too, its generation stopped."""
    before = _cancelled(stack)
    config = BridgeConfig(nats=NatsSettings(url=stack.nats_url), port=0, background_lease_s=LEASE_S)
    async with Bridge(config, stack.settings) as doomed:
        await doomed.wait_ready()
        other_edge = openai.AsyncOpenAI(base_url=f"{doomed.url}/v1", api_key=KEY, max_retries=0)
        stream = await other_edge.responses.create(
            model="slow", input="Write a long story", background=True, stream=True, max_output_tokens=4000
        )
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_text.delta":
                break
        await stream.close()
    failed = await _ends(client, response_id)
    assert failed.status == "failed" and failed.error.message == BRIDGE_LOST
    events = [e async for e in await client.responses.retrieve(response_id, stream=True, starting_after=-1)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.failed"
    assert await eventually(lambda: _cancelled(stack) == before + 1)


async def test_a_silent_bridge_that_wakes_up_leaves_its_successor_alone(stack, client):
    """Its bridge stalls past the lease (a long pause, a partition) and the stack's bridge takes the
    response over. When it wakes, its write is refused (the record moved on): it stops there, and
    leaves the list entry, which the new owner's own end removes, to the new owner."""
    config = BridgeConfig(nats=NatsSettings(url=stack.nats_url), port=0, background_lease_s=LEASE_S)
    async with Bridge(config, stack.settings) as stalled:
        await stalled.wait_ready()
        edge = openai.AsyncOpenAI(base_url=f"{stalled.url}/v1", api_key=KEY, max_retries=0)
        created = await edge.responses.create(
            model="slow", input="Write a long story", background=True, max_output_tokens=LONG
        )
        await stalled.takeover.stop()  # its sweep would unlist the response once ended: not what is tested
        awake, unlisted = asyncio.Event(), []
        put, unlist = stalled.responses.put, stalled.responses.unlist

        async def held_put(*args, **kwargs):
            await awake.wait()
            return await put(*args, **kwargs)

        async def counted_unlist(*args):
            unlisted.append(args)
            await unlist(*args)

        stalled.responses.put, stalled.responses.unlist = held_put, counted_unlist

        async def taken_over() -> bool:
            record = (await stack.bridge.responses.get("demo", created.id))[0]
            return record.owner == stack.bridge.edge_id

        assert await eventually(taken_over)
        awake.set()
        assert await eventually(lambda: not stalled.background.runs(f"demo.{created.id}"))
        assert unlisted == []
    done = await _ends(client, created.id)
    assert done.status == "incomplete" and done.usage.output_tokens == LONG


async def test_an_idempotent_retry_never_replaces_the_kept_request(stack, client):
    """A second create under the same Idempotency-Key, with another body, is refused before it
    can touch what the first one kept for a takeover."""
    key = {"Idempotency-Key": "background-once"}
    first = await client.responses.create(
        model="slow", input="The first body", background=True, max_output_tokens=LONG, extra_headers=key
    )
    with pytest.raises(openai.APIStatusError) as err:
        await client.responses.create(
            model="slow", input="A second body", background=True, max_output_tokens=LONG, extra_headers=key
        )
    assert err.value.body["param"] == "Idempotency-Key"
    kept = await stack.bridge.responses.listed("demo", first.id)
    assert kept is None or b"The first body" in stored.decode_rerun(kept).body  # None: it ended already
    await client.responses.cancel(first.id)


async def test_a_request_that_no_longer_reads_fails_instead_of_looping(stack, client):
    """The listed request cannot be rebuilt (another version of Laneway wrote it, say): the
    takeover marks the response failed once, rather than retry it every lease for ever."""
    response_id = await _on_a_second_bridge(stack, crash=True)
    nc = await nats.connect(stack.nats_url)
    try:
        await nc.jetstream().publish(f"$KV.lw_background.demo.{response_id}", b"\xc1 not msgpack")
    finally:
        await nc.close()
    failed = await _ends(client, response_id)
    assert failed.status == "failed" and failed.error.message == BRIDGE_LOST
