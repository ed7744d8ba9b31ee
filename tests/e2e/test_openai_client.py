"""End to end with the official `openai` client: bridge + broker + sim worker on a real nats-server."""

from __future__ import annotations

import asyncio


async def test_streaming_chat(client):
    stream = await client.chat.completions.create(
        model="laneway-sim",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() and len(text.split()) == 12
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens > 0


async def test_non_streaming_chat(client):
    completion = await client.chat.completions.create(
        model="laneway-sim", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    assert completion.choices[0].message.role == "assistant"
    assert len(completion.choices[0].message.content.split()) == 5
    assert completion.usage.completion_tokens == 5
    assert completion.id.startswith("chatcmpl-")


async def test_many_concurrent_streams(client):
    async def one(i: int) -> int:
        stream = await client.chat.completions.create(
            model="laneway-sim", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=20, stream=True
        )
        return len([c async for c in stream if c.choices and c.choices[0].delta.content])

    counts = await asyncio.gather(*(one(i) for i in range(64)))
    assert all(c >= 1 for c in counts)


async def test_models_list(client):
    models = await client.models.list()
    assert [m.id for m in models.data] == ["laneway-sim"]
