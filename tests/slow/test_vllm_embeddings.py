"""The vllm engine as an embedding worker: vLLM's pooling runner and its own `ServingEmbedding`,
in-process, against a real small model (SmolLM2 converted to an embedding model: last-token
pooling, normalised), no mocks.

One engine for the whole module (starting one takes about a minute on two CPU cores). Verdicts
rest on structure (counts, sizes, float32, determinism, refusals by name), never on how good the
vectors are: a converted chat model is not a trained embedding model.
"""

from __future__ import annotations

import asyncio
import json
import math
from array import array
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from schemas.openai import ChatBody, EmbeddingBody, Message
from tests.slow.conftest import vllm_model_dir
from tests.wait import eventually
from workers.engine import EngineOutput, EngineRequest, UnsupportedRequest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

SLOTS = 8
# The same input in another batch: the same direction up to float summation order (0.99992
# was seen on one CPU), so "the same" is a cosine above this, never a bitwise match.
SAME = 0.999


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    config = VllmConfig(
        model=str(vllm_model_dir()),
        served_model_name="smollm2-embed",
        max_model_len=512,
        max_num_seqs=SLOTS,
        kv_cache_bytes=128 * 1024**2,
        embedding=True,
        convert="embed",
    )
    eng = VllmEngine(config)
    await eng.start()
    yield eng
    await eng.cleanup()
    await eng.cleanup()  # idempotent


def body(input: Any, **fields: Any) -> EmbeddingBody:
    return msgspec.convert({"model": "smollm2-embed", "input": input, **fields}, EmbeddingBody)


async def embed(engine, b: EmbeddingBody, rid: str = "e", extra: dict | None = None, **kw: Any) -> EngineOutput:
    request = EngineRequest(rid, b, json.dumps(extra).encode() if extra else b"", **kw)
    outs = [out async for out in engine.generate(request)]
    assert len(outs) == 1, "an embedding is answered by exactly one output"
    return outs[0]


def floats(raw: bytes) -> list[float]:
    return array("f", raw).tolist()


def cosine(a: bytes, b: bytes) -> float:
    x, y = floats(a), floats(b)
    return sum(p * q for p, q in zip(x, y, strict=True)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))


async def test_one_float32_vector_per_input_of_the_models_hidden_size(engine):
    hidden = engine._llm.model_config.get_hidden_size()
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by four percent.", "The cat sat on the mat.", "Bonjour"]
    out = await embed(engine, body(texts), cache_salt="tenant-scope-salt")
    assert out.finish_reason == "stop" and out.completion_tokens == 0
    assert len(out.vectors) == len(texts)
    for v in out.vectors:
        assert len(v) == 4 * hidden
        values = floats(v)
        assert all(math.isfinite(x) for x in values)
        assert math.isclose(math.sqrt(sum(x * x for x in values)), 1.0, rel_tol=1e-3)  # normalised
    # Same input, same direction; a different input is further away than that.
    assert cosine(out.vectors[0], out.vectors[2]) > max(SAME, cosine(out.vectors[0], out.vectors[1]))
    assert out.vectors[3] not in out.vectors[:3]
    assert out.prompt_tokens >= len(texts)


async def test_vectors_are_in_input_order_and_repeatable(engine):
    a, b = "first input", "a second, different input"
    both = await embed(engine, body([a, b]), rid="order-1")
    reverse = await embed(engine, body([b, a]), rid="order-2")
    alone = await embed(engine, body(a), rid="order-3")
    # The same input gives the same direction, whatever else shares its batch; the floats need
    # not match bit for bit (batch composition changes the kernels' summation order).
    # In input order: each vector is nearer its own input's vector from the other batch than
    # the other input's.
    assert cosine(both.vectors[0], reverse.vectors[1]) > max(SAME, cosine(both.vectors[0], reverse.vectors[0]))
    assert cosine(both.vectors[1], reverse.vectors[0]) > max(SAME, cosine(both.vectors[1], reverse.vectors[1]))
    assert cosine(alone.vectors[0], both.vectors[0]) > SAME
    assert alone.prompt_tokens < both.prompt_tokens


async def test_token_id_inputs_count_exactly(engine):
    one = await embed(engine, body([9, 28, 4, 77, 301]), rid="ids-1")
    assert len(one.vectors) == 1 and one.prompt_tokens == 5
    many = await embed(engine, body([[9, 28, 4, 77, 301], [12, 13], [9, 28, 4, 77, 301]]), rid="ids-2")
    assert len(many.vectors) == 3 and many.prompt_tokens == 12
    assert cosine(many.vectors[0], many.vectors[2]) > max(SAME, cosine(many.vectors[0], many.vectors[1]))
    assert cosine(many.vectors[0], one.vectors[0]) > SAME


async def test_concurrent_requests_and_the_slots_come_back(engine):
    bodies = [body([f"request {i} text {j}" for j in range(3)]) for i in range(4)]
    outs = await asyncio.gather(*(embed(engine, b, rid=f"c{i}", klass="batch") for i, b in enumerate(bodies)))
    assert [len(o.vectors) for o in outs] == [3] * 4
    assert await eventually(lambda: engine.num_unfinished() == 0, timeout=30)
    cap = engine.capacity()
    assert cap.free_slots == SLOTS and cap.running == {}


async def test_a_cancelled_request_is_aborted_in_the_engine(engine):
    request = EngineRequest("cancel-me", body(["a long input " * 40] * 16))
    task = asyncio.ensure_future(anext(engine.generate(request)))
    assert await eventually(lambda: engine.num_unfinished() > 0 or task.done(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: engine.num_unfinished() == 0, timeout=30)
    assert engine.capacity().free_slots == SLOTS and engine._live == {} and engine._vllm_ids == {}
    assert len((await embed(engine, body("still serving"), rid="after-cancel")).vectors) == 1


@pytest.mark.parametrize(
    "b, extra, param",
    [
        (body("x", dimensions=64), None, "dimensions"),  # not a Matryoshka model
        (body("x"), {"embed_dtype": "float16"}, "embed_dtype"),  # ours to choose
        (body("x"), {"no_such_field": 1}, "no_such_field"),
        (body("word " * 2000), None, "input"),  # > max_model_len 512
    ],
)
async def test_what_cannot_be_honoured_is_refused_by_name(engine, b, extra, param):
    with pytest.raises(UnsupportedRequest) as err:
        await embed(engine, b, rid="refused", extra=extra)
    assert err.value.param == param
    assert engine._live == {}


async def test_vllms_own_extras_are_honoured(engine):
    long = await embed(engine, body("one two three four five six seven eight nine ten"), rid="t1")
    cut = await embed(
        engine, body("one two three four five six seven eight nine ten"), rid="t2", extra={"truncate_prompt_tokens": 3}
    )
    assert cut.prompt_tokens == 3 < long.prompt_tokens
    assert cut.vectors[0] != long.vectors[0]


async def test_a_generation_body_is_refused_naming_model(engine):
    chat = ChatBody(model="smollm2-embed", messages=[Message(role="user", content="hi")], max_tokens=4)
    with pytest.raises(UnsupportedRequest) as err:
        [o async for o in engine.generate(EngineRequest("chat", chat))]
    assert err.value.param == "model"


async def test_a_generation_worker_refuses_embeddings_naming_model():
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    generation = VllmEngine(VllmConfig(model=str(vllm_model_dir())))  # not started: no engine needed
    with pytest.raises(UnsupportedRequest) as err:
        [o async for o in generation.generate(EngineRequest("e", body("x")))]
    assert err.value.param == "model" and "embeddings" in err.value.message


async def test_the_embedding_flag_selects_the_pooling_runner():
    import argparse

    from workers.engines.vllm.config import VllmConfig

    parser = argparse.ArgumentParser()
    VllmConfig.configure(parser)
    config = VllmConfig.from_args(
        parser.parse_args(["--model", str(vllm_model_dir()), "--embedding", "--convert", "embed"])
    )
    assert config.embedding and config.convert == "embed"
    args = config.engine_args()
    assert (args.runner, args.convert) == ("pooling", "embed")
    plain = VllmConfig.from_args(parser.parse_args(["--model", str(vllm_model_dir())]))
    assert not plain.embedding and plain.engine_args().runner == "auto"
