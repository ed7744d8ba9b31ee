"""The SIMULATED engine answers embedding requests: deterministic unit vectors from a hash of each
input (a simulation, not a model), timed as one prefill step that holds a slot while it runs."""

from __future__ import annotations

import asyncio
import json
import math
import time
from array import array
from typing import Any

import msgspec
import pytest

from schemas.openai import ChatBody, EmbeddingBody, Message
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, RequestKey, UnsupportedRequest
from workers.engines.sim.embed import NATIVE_DIMENSIONS, vector
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES, SimProfile


def body(input: Any, **fields: Any) -> EmbeddingBody:
    return msgspec.convert({"model": "sim", "input": input, **fields}, EmbeddingBody)


def floats(raw: bytes) -> list[float]:
    return array("f", raw).tolist()


def cosine(a: bytes, b: bytes) -> float:
    x, y = floats(a), floats(b)
    return sum(p * q for p, q in zip(x, y, strict=True)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))


@pytest.fixture
async def engine():
    e = SimEngine(PROFILES["zero"])
    await e.start()
    yield e
    await e.cleanup()


async def run(engine: SimEngine, b: Any, extra: dict | None = None, rid: str = "r", **kw: Any) -> list[EngineOutput]:
    request = EngineRequest(rid, b, json.dumps(extra).encode() if extra else b"", **kw)
    return [out async for out in engine.generate(request)]


async def test_one_output_with_one_unit_float32_vector_per_input_in_order(engine):
    texts = ["the cat sat on the mat", "a dog", "the cat sat on the mat", "x" * 41]
    outs = await run(engine, body(texts))
    assert len(outs) == 1
    out = outs[0]
    assert out.finish_reason == "stop" and out.completion_tokens == 0 and out.text == ""
    assert len(out.vectors) == 4
    for v in out.vectors:
        assert len(v) == 4 * NATIVE_DIMENSIONS
        values = floats(v)
        assert all(math.isfinite(x) for x in values)
        assert math.isclose(math.sqrt(sum(x * x for x in values)), 1.0, rel_tol=1e-5)
    assert out.vectors[0] == out.vectors[2] and cosine(out.vectors[0], out.vectors[2]) == pytest.approx(1.0)
    assert out.vectors[0] != out.vectors[1] and abs(cosine(out.vectors[0], out.vectors[1])) < 0.5
    assert out.vectors == [vector(t) for t in texts]  # in input order
    # ~4 characters a token, as the sim's chat prompts: 6 + 2 + 6 + 11
    assert out.prompt_tokens == 25


async def test_the_same_input_gives_the_same_vector_across_requests_and_engines(engine):
    first = (await run(engine, body("hello world")))[0].vectors
    again = (await run(engine, body(["hello world"]), rid="r2"))[0].vectors
    other = SimEngine(PROFILES["zero"])
    await other.start()
    try:
        elsewhere = (await run(other, body("hello world")))[0].vectors
    finally:
        await other.cleanup()
    assert first == again == elsewhere


async def test_token_id_inputs_one_list_or_many(engine):
    one = (await run(engine, body([1, 2, 3, 4, 5])))[0]
    assert len(one.vectors) == 1 and one.prompt_tokens == 5
    many = (await run(engine, body([[1, 2, 3, 4, 5], [7, 8], [1, 2, 3, 4, 5]])))[0]
    assert len(many.vectors) == 3 and many.prompt_tokens == 12
    assert many.vectors[0] == one.vectors[0] == many.vectors[2] != many.vectors[1]
    # token ids are not the text they might spell: their own vectors
    assert (await run(engine, body("[1, 2, 3, 4, 5]")))[0].vectors[0] != one.vectors[0]


async def test_dimensions_are_leading_components_renormalised(engine):
    full = floats((await run(engine, body("matryoshka")))[0].vectors[0])
    short = (await run(engine, body("matryoshka", dimensions=64)))[0].vectors[0]
    assert len(short) == 4 * 64
    values = floats(short)
    assert math.isclose(math.sqrt(sum(x * x for x in values)), 1.0, rel_tol=1e-5)
    norm = math.sqrt(sum(x * x for x in full[:64]))
    assert values == pytest.approx([x / norm for x in full[:64]], rel=1e-5, abs=1e-6)
    both = (await run(engine, body("matryoshka", dimensions=NATIVE_DIMENSIONS)))[0].vectors[0]
    assert floats(both) == pytest.approx(full)


@pytest.mark.parametrize(
    "b, extra, param",
    [
        (body("x", dimensions=NATIVE_DIMENSIONS + 1), None, "dimensions"),
        (body(["a", 1]), None, "input"),
        (body("x"), {"dimension": 3}, "dimension"),
        (body("x"), {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        (body("x"), {"use_activation": "yes"}, "use_activation"),
        (body("y" * 40_000), None, "input"),  # 10,000 tokens > the 8,192-token context
        (body([[1], []]), None, "input"),
    ],
)
async def test_what_the_sim_cannot_honour_is_refused_by_name(engine, b, extra, param):
    with pytest.raises(UnsupportedRequest) as err:
        await run(engine, b, extra)
    assert err.value.param == param
    assert engine.capacity().free_slots == engine.max_seqs  # nothing was admitted


async def test_honoured_and_accepted_extras(engine):
    extra = {"truncate_prompt_tokens": 4, "add_special_tokens": True, "use_activation": None}
    out = (await run(engine, body(["z" * 400, "y" * 8]), extra))[0]
    assert out.prompt_tokens == 4 + 2 and len(out.vectors) == 2
    ids = (await run(engine, body([[1, 2, 3, 4, 5, 6], [9]]), extra))[0]
    assert ids.prompt_tokens == 4 + 1
    assert ids.vectors[0] == (await run(engine, body([3, 4, 5, 6]), rid="r2"))[0].vectors[0]  # the end kept


def _profile(prefill_s_per_token: float) -> SimProfile:
    return SimProfile("embed-test", prefill_s_per_token, 0.0, 0.0, 2, 1 << 20, "unit test")


async def test_an_embedding_is_one_prefill_step_holding_a_slot_while_it_runs():
    engine = SimEngine(_profile(0.001))  # 1 ms a prompt token
    await engine.start()
    try:
        request = EngineRequest("e", body(["w" * 800, "v" * 800]), klass="batch")  # 400 tokens: 0.4 s
        task = asyncio.ensure_future(anext(engine.generate(request)))
        started = time.monotonic()
        assert await eventually(lambda: engine.capacity().free_slots == 1, timeout=5)
        cap = engine.capacity()
        assert cap.running == {"batch": 1} and cap.token_budget == (1 << 20) - 400
        out = await task
        elapsed = time.monotonic() - started
        assert 0.3 < elapsed < 5.0  # the modelled prefill, not instant
        assert engine.steps == 1  # prefill only: no decode steps
        assert out.prompt_tokens == 400 and len(out.vectors) == 2
        assert engine.capacity().free_slots == 2 and engine.capacity().token_budget == 1 << 20
    finally:
        await engine.cleanup()


async def test_embeddings_and_generations_share_the_slots():
    engine = SimEngine(_profile(0.0005), max_seqs=1)
    await engine.start()
    try:
        emb = asyncio.ensure_future(run(engine, body("q" * 2000), rid="e"))  # 500 tokens: 0.25 s
        assert await eventually(lambda: engine.capacity().free_slots == 0, timeout=5)
        chat = ChatBody(model="sim", messages=[Message(role="user", content="hi")], max_tokens=2)
        gen = asyncio.ensure_future(run(engine, chat, rid="c"))
        await asyncio.sleep(0)
        assert engine.capacity().free_slots == 0  # the chat waits for the slot
        (e,) = await emb
        outs = await gen
        assert len(e.vectors) == 1 and outs[-1].completion_tokens == 2
    finally:
        await engine.cleanup()


async def test_abort_frees_the_slot_and_returns_no_vectors():
    engine = SimEngine(_profile(0.01))  # 10 ms a token: a long prefill
    await engine.start()
    try:
        stream = engine.generate(EngineRequest("e", body("a" * 4000)))
        task = asyncio.ensure_future(anext(stream))
        assert await eventually(lambda: engine.capacity().free_slots == 1, timeout=5)
        await engine.abort(RequestKey("", "e"))
        out = await task
        assert out.finish_reason == "abort" and out.vectors == []
        assert engine.capacity().free_slots == 2
    finally:
        await engine.cleanup()
