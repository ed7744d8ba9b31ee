"""Ids outside the store's key alphabet (NATS KV keys: letters, digits, `-_=/.`; no `*`, `>`,
spaces or NUL) are ids nobody was ever given: every route that takes one answers them as any
unknown id, 404 in the OpenAI error shape, never a 500 with a traceback in the log. On 0ea08ee
the files, batches, responses and conversations routes answered 500 `internal_error`."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from tests.e2e.conftest import KEY

# As a client would send them in a path: raw, and percent-encoded (aiohttp decodes the latter).
IDS = ["*", ">", "acme.*", "%2A", "a%20b", "%00", "file-%3E", "..", "a.b", "x%2Fy", "%3E"]

ROUTES = [
    ("GET", "/v1/files/{id}"),
    ("DELETE", "/v1/files/{id}"),
    ("GET", "/v1/files/{id}/content"),
    ("GET", "/v1/batches/{id}"),
    ("POST", "/v1/batches/{id}/cancel"),
    ("GET", "/v1/responses/{id}"),
    ("DELETE", "/v1/responses/{id}"),
    ("GET", "/v1/responses/{id}/input_items"),
    ("POST", "/v1/responses/{id}/cancel"),
    ("GET", "/v1/conversations/{id}"),
    ("POST", "/v1/conversations/{id}"),
    ("DELETE", "/v1/conversations/{id}"),
    ("GET", "/v1/conversations/{id}/items"),
    ("POST", "/v1/conversations/{id}/items"),
    ("GET", "/v1/conversations/conv_x/items/{id}"),
    ("DELETE", "/v1/conversations/conv_x/items/{id}"),
]

BODIES = {
    "/v1/conversations/{id}": {"metadata": {"a": "b"}},
    "/v1/conversations/{id}/items": {"items": [{"type": "message", "role": "user", "content": "hi"}]},
}


def assert_unknown(resp: httpx.Response, what: str) -> None:
    assert resp.status_code in (400, 404), (what, resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"], (what, error)


async def test_ids_outside_the_key_alphabet_are_unknown_on_every_route(stack, caplog):
    headers = {"Authorization": f"Bearer {KEY}"}
    with caplog.at_level(logging.INFO):
        async with httpx.AsyncClient(base_url=stack.url, headers=headers, timeout=30) as http:
            for method, route in ROUTES:
                for bad in IDS:
                    path = route.format(id=bad)
                    resp = await http.request(method, path, json=BODIES.get(route) if method == "POST" else None)
                    assert_unknown(resp, f"{method} {path}")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("bad", ["*", ">", "acme.*", "a b", "\x00", "file->", "resp_a.b"])
async def test_ids_in_request_bodies_outside_the_alphabet_are_unknown(stack, caplog, bad):
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    with caplog.at_level(logging.INFO):
        with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
            await client.responses.create(model="laneway-sim", input="hi", previous_response_id=bad)
        with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
            await client.responses.create(model="laneway-sim", input="hi", conversation=bad)
        with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
            await client.batches.create(input_file_id=bad, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
            await client.files.retrieve(bad)
    await client.close()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
