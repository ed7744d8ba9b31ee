"""Order at the bridge's door: while a flood of batch streams holds a bridge at its stream limit,
an interactive request is answered and one more batch request is refused (503 `overloaded`).
A real nats-server, broker, worker and bridge (`--max-streams` 10), real HTTP (aiohttp for the
flood, the official `openai` client for the chat and a /v1/responses call); no timing: the engine
holds every HOLD stream after its first token until the test lets it go."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from bridge.config import BridgeConfig
from loadtest.stack import Stack, demo_settings
from tests.e2e.test_overload import CHAT, HeldEngine, body, chunks_until_content, rest_of_stream
from tests.wait import eventually

KEY = "sk-test-overload-order"
AUTH = {"Authorization": f"Bearer {KEY}"}
CAP = 10
BATCH = {"x-laneway-class": "batch"}
INTERACTIVE = {"x-laneway-class": "interactive"}


@pytest.fixture(scope="module")
async def engine() -> HeldEngine:
    return HeldEngine()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[engine],
        prefix="order",
        bridge_config=BridgeConfig(max_streams=CAP),
    ) as s:
        yield s


async def test_a_chat_is_answered_while_a_batch_flood_holds_the_bridge(stack, engine):
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    held: list[aiohttp.ClientResponse] = []
    async with aiohttp.ClientSession(base_url=stack.url) as http:
        try:
            for _ in range(CAP + 1):  # batch streams until the bridge refuses one
                resp = await http.post(CHAT, json=body(stream=True), headers={**AUTH, **BATCH})
                if resp.status != 200:
                    break
                held.append(resp)
                await chunks_until_content(resp)
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 0
            assert (await resp.json())["error"]["code"] == "overloaded"
            assert len(stack.bridge.demux) == len(held)

            # Not held (no HOLD in it): answered whole, on /v1/responses too.
            answer = await client.responses.create(
                model="laneway-sim", input="hi", max_output_tokens=4, store=False, extra_headers=INTERACTIVE
            )
            assert answer.output_text
            chat = await client.chat.completions.create(
                model="laneway-sim",
                stream=True,
                max_tokens=8,
                extra_headers=INTERACTIVE,
                messages=[{"role": "user", "content": "HOLD: a chat while the flood holds the bridge"}],
            )
            async for chunk in chat:
                if chunk.choices and chunk.choices[0].delta.content:
                    break  # its first token came: the chat is being answered
            assert len(held) < CAP and len(stack.bridge.demux) == len(held) + 1

            with pytest.raises(openai.InternalServerError) as refused:
                await client.chat.completions.create(
                    model="laneway-sim",
                    max_tokens=4,
                    extra_headers=BATCH,
                    messages=[{"role": "user", "content": "one more"}],
                )
            assert refused.value.status_code == 503 and refused.value.body["code"] == "overloaded"
            with pytest.raises(openai.InternalServerError):
                await client.responses.create(model="laneway-sim", input="one more", store=False, extra_headers=BATCH)

            engine.release.set()
            async for _ in chat:
                pass
            for resp in held:
                rest, done = await rest_of_stream(resp)
                assert done and not any("error" in c for c in rest), rest
        finally:
            engine.release.set()
            for resp in held:
                resp.release()
            await client.close()
    assert await eventually(lambda: len(stack.bridge.demux) == 0)
