"""The OpenAI Agents SDK (`openai-agents`) against the bridge: an `Agent` on `OpenAIResponsesModel`
runs two turns, the second continuing the first by `previous_response_id`. The SDK sends only the
new input; the engine is handed the whole conversation, rebuilt from the store. The sim
SIMULATES text: the test checks what the engine saw, never the words."""

from __future__ import annotations

import json

import openai
import pytest

from loadtest.stack import Stack, demo_settings
from tests.e2e.test_stored_responses import RecordingSim

agents = pytest.importorskip("agents")

KEY = "sk-agents-sdk"
MODEL = "laneway-sim"


@pytest.fixture(scope="module")
async def engine():
    return RecordingSim()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    async with Stack(nats_server.url, demo_settings(KEY), engines=[engine]) as s:
        yield s


async def test_two_turns_chained_by_previous_response_id(stack, engine):
    agents.set_tracing_disabled(True)  # no export to OpenAI's tracing endpoint
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    agent = agents.Agent(name="clerk", instructions="Answer briefly.", model=agents.OpenAIResponsesModel(MODEL, client))
    first = await agents.Runner.run(agent, "My order is AB123456.")
    assert first.last_response_id and first.final_output
    sent: list[dict] = []

    async def keep(request) -> None:  # what the SDK puts on the wire for the second turn
        if request.url.path.endswith("/responses"):
            sent.append(json.loads(request.content))

    client._client.event_hooks["request"].append(keep)
    second = await agents.Runner.run(agent, "Which order was that?", previous_response_id=first.last_response_id)
    assert second.final_output
    [body] = sent
    assert body["previous_response_id"] == first.last_response_id
    assert [item["content"] for item in body["input"]] == ["Which order was that?"]  # only the new input
    seen = engine.seen[-1].messages
    assert [(m.role, m.content) for m in seen] == [
        ("system", "Answer briefly."),
        ("user", "My order is AB123456."),
        ("assistant", first.final_output),
        ("user", "Which order was that?"),
    ]
    assert second.raw_responses[-1].usage.input_tokens > first.raw_responses[-1].usage.input_tokens
    await client.close()
