"""`POST /v1/embeddings` end to end with the official `openai` client: bridge + broker + sim worker
on a real nats-server. The sim's vectors are a SIMULATION (a hash of each input, unit length);
these tests check what Laneway carries (shape, encodings, order, usage, refusals), not meaning."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

from tests.e2e.conftest import KEY

MODEL = "laneway-sim"
SIM_DIMS = 384  # workers.engines.sim.embed.NATIVE_DIMENSIONS


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


async def test_float_embeddings_one_per_input_in_order_with_usage(client):
    texts = ["the cat sat on the mat", "quarterly revenue grew", "the cat sat on the mat"]
    result = await client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert result.object == "list" and result.model == MODEL
    assert [d.index for d in result.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == SIM_DIMS for d in result.data)
    a, b, c = (d.embedding for d in result.data)
    assert all(math.isfinite(x) for x in a + b)
    assert norm(a) == pytest.approx(1.0, rel=1e-5)
    assert a == c and cosine(a, c) == pytest.approx(1.0) and a != b
    assert result.usage.prompt_tokens > 0 and result.usage.total_tokens == result.usage.prompt_tokens


async def test_base64_decoded_by_the_client_equals_float(client):
    texts = ["hello", "world"]
    floats = await client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    # Without encoding_format the client asks for base64 itself and decodes it to floats.
    default = await client.embeddings.create(model=MODEL, input=texts)
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    # Asked explicitly, it hands back the base64 text: float32 little-endian.
    raw = await client.embeddings.create(model=MODEL, input=texts, encoding_format="base64")
    for d, f in zip(raw.data, floats.data, strict=True):
        assert isinstance(d.embedding, str)
        data = base64.b64decode(d.embedding)
        assert len(data) == 4 * SIM_DIMS
        assert list(struct.unpack(f"<{SIM_DIMS}f", data)) == f.embedding


async def test_a_single_string_and_dimensions(client):
    one = await client.embeddings.create(model=MODEL, input="just one text", encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == SIM_DIMS
    short = await client.embeddings.create(model=MODEL, input="just one text", dimensions=64, encoding_format="float")
    vec = short.data[0].embedding
    assert len(vec) == 64 and norm(vec) == pytest.approx(1.0, rel=1e-5)
    assert cosine(vec, one.data[0].embedding[:64]) == pytest.approx(1.0, abs=1e-5)


async def test_token_id_inputs(client):
    many = await client.embeddings.create(
        model=MODEL, input=[[101, 2023, 2003], [7, 8], [101, 2023, 2003]], encoding_format="float"
    )
    assert len(many.data) == 3 and many.usage.prompt_tokens == 8
    assert many.data[0].embedding == many.data[2].embedding != many.data[1].embedding
    one = await client.embeddings.create(model=MODEL, input=[101, 2023, 2003], encoding_format="float")
    assert len(one.data) == 1 and one.data[0].embedding == many.data[0].embedding
    assert one.usage.prompt_tokens == 3


async def test_dimensions_beyond_the_model_are_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.embeddings.create(model=MODEL, input="x", dimensions=SIM_DIMS + 1)
    assert err.value.body["param"] == "dimensions"


async def test_mixed_input_is_refused_naming_input(client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.embeddings.create(model=MODEL, input=["text", 42])  # type: ignore[list-item]
    assert err.value.body["param"] == "input"


async def test_a_chat_body_sent_to_the_embeddings_endpoint_is_refused_cleanly(stack):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        resp = await http.post("/v1/embeddings", json=chat, headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert "input" in error["message"]  # the missing field is named in the message
    assert resp.headers.get("x-request-id")
