"""Stored responses (`store`, OpenAI's default) end to end with the official `openai` client: bridge +
broker + a recording sim worker on a real nats-server. What is kept, for whom, for how long, and
that a delete leaves nothing in the stream. The sim SIMULATES text: these tests check shapes,
keys and what the engine was given, never words."""

from __future__ import annotations

import asyncio

import httpx
import nats
import nats.js.errors
import openai
import pytest

from core.policy.stored import DAY_S, StoragePolicy
from core.policy.tenants import Tenant, hash_key
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack
from schemas.subjects import stored_response_key
from tests.openapi import validator
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

MODEL = "laneway-sim"
KEY, OTHER_KEY, UNSTORED_KEY, SHORT_KEY = "sk-stored-a", "sk-stored-b", "sk-stored-off", "sk-stored-short"
STREAM, BUCKET = "KV_lw_responses", "lw_responses"


class RecordingSim(SimEngine):
    """The sim, keeping every chat body it is handed: what the model saw."""

    def __init__(self) -> None:
        super().__init__(PROFILES["zero"])
        self.seen: list = []

    async def generate(self, request):
        self.seen.append(request.body)
        async for out in super().generate(request):
            yield out


def _settings() -> Settings:
    def tenant(name: str, key: str, **policy) -> Tenant:
        return Tenant(name=name, api_key_sha256=[hash_key(key)], responses=StoragePolicy(**policy))

    tenants = [
        tenant("acme", KEY),
        tenant("globex", OTHER_KEY),
        tenant("quiet", UNSTORED_KEY, store=False),
        tenant("brief", SHORT_KEY, retention_days=2 / DAY_S),
    ]
    return Settings(tenants={t.name: t for t in tenants}, models={MODEL: LogicalModel(pool="sim")})


@pytest.fixture(scope="module")
async def engine():
    return RecordingSim()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    async with Stack(nats_server.url, _settings(), engines=[engine]) as s:
        yield s


def _client(stack, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


@pytest.fixture
async def js(nats_server):
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


async def _stored_bytes(js, tenant: str, response_id: str) -> bytes | None:
    try:
        msg = await js.get_last_msg(STREAM, f"$KV.{BUCKET}.{stored_response_key(tenant, response_id)}")
    except nats.js.errors.NotFoundError:
        return None
    return msg.data


async def _retrieved(client, response_id: str):
    """The stored response: written before the answer's end, so there at once."""
    return await client.responses.retrieve(response_id)


# -- store, retrieve, list, delete --------------------------------------------------------------
async def test_a_response_is_stored_by_default_and_retrieved_whole(stack):
    client = _client(stack)
    created = await client.responses.create(
        model=MODEL, input="Say hello", instructions="Be brief.", metadata={"k": "v"}
    )
    assert created.model_extra["store"] is True
    got = await _retrieved(client, created.id)
    assert got.id == created.id and got.status == "completed" and got.output_text == created.output_text
    assert got.usage.input_tokens == created.usage.input_tokens and got.metadata == {"k": "v"}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        raw = await http.get(f"/v1/responses/{created.id}", headers={"Authorization": f"Bearer {KEY}"})
    validator("Response").validate(raw.json())


async def test_a_streamed_response_is_stored_too(stack):
    client = _client(stack)
    stream = await client.responses.create(model=MODEL, input="Say hello", stream=True)
    events = [e async for e in stream]
    final = events[-1].response
    got = await _retrieved(client, final.id)
    assert got.status == "completed" and got.output_text == final.output_text


@pytest.fixture
def slow_writes(stack, monkeypatch):
    """Every write of the bridge's response store (records and conversations) takes 0.5 s more:
    an answer that did not wait for its write would be read before the write lands."""
    store = stack.bridge.responses
    put = store.put

    async def slow_put(*args, **kwargs):
        await asyncio.sleep(0.5)
        return await put(*args, **kwargs)

    monkeypatch.setattr(store, "put", slow_put)


async def test_a_client_that_read_the_answer_finds_the_response_and_its_turn_at_once(stack, slow_writes):
    """Read-your-writes, as OpenAI's API: the record (and the conversation's new items) are
    written before the answer's end is sent, whole or streamed."""
    client = _client(stack)
    whole = await client.responses.create(model=MODEL, input="Say hello", max_output_tokens=5)
    got = await client.responses.retrieve(whole.id)
    assert got.status == whole.status and got.output_text == whole.output_text
    stream = await client.responses.create(model=MODEL, input="Say hello", max_output_tokens=5, stream=True)
    final = [e async for e in stream][-1].response
    assert (await client.responses.retrieve(final.id)).output_text == final.output_text
    conversation = await client.conversations.create()
    turn = await client.responses.create(
        model=MODEL, input="Remember this.", max_output_tokens=5, conversation=conversation.id
    )
    items = (await client.conversations.items.list(conversation.id, order="asc")).data
    assert [i.type for i in items] == ["message", "message"] and items[-1].id == turn.output[0].id


async def test_input_items_list_the_input_in_order_with_paging(stack):
    client = _client(stack)
    created = await client.responses.create(
        model=MODEL,
        max_output_tokens=4,
        input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "input_text", "text": "first"}, {"type": "input_text", "text": "x"}]},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": "second"},
        ],
    )
    await _retrieved(client, created.id)
    async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        whole = (await http.get(f"/v1/responses/{created.id}/input_items", params={"order": "asc"})).json()
        validator("ResponseItemList").validate(whole)
        refused = await http.get(f"/v1/responses/{created.id}/input_items", params={"limit": "0"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"
    assert [(i["role"], i["content"][0]["text"]) for i in whole["data"]] == [
        ("developer", "Answer in English."),
        ("user", "first"),
        ("assistant", "Sure."),
        ("user", "second"),
    ]
    newest_first = await client.responses.input_items.list(created.id, limit=2)
    assert [i.role for i in newest_first.data] == ["user", "assistant"] and newest_first.has_more
    rest = await client.responses.input_items.list(created.id, limit=10, after=newest_first.last_id)
    assert [i.role for i in rest.data] == ["user", "developer"] and not rest.has_more


async def test_delete_leaves_no_revision_in_the_stream(stack, js):
    client = _client(stack)
    created = await client.responses.create(model=MODEL, input="Remember the code 4417")
    await _retrieved(client, created.id)
    assert b"4417" in await _stored_bytes(js, "acme", created.id)
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    # The purge rolled every revision up into a marker without data, which expires in turn.
    assert not await _stored_bytes(js, "acme", created.id)
    assert await eventually(lambda: _gone(js, "acme", created.id))
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)


async def _gone(js, tenant: str, response_id: str) -> bool:
    try:
        await js.get_last_msg(STREAM, f"$KV.{BUCKET}.{stored_response_key(tenant, response_id)}")
    except nats.js.errors.NotFoundError:
        return True
    return False


async def test_store_false_keeps_nothing(stack, js):
    client = _client(stack)
    created = await client.responses.create(model=MODEL, input="hi", store=False)
    assert created.model_extra["store"] is False
    later = await client.responses.create(model=MODEL, input="hi")  # stored after the first, if at all
    await _retrieved(client, later.id)
    assert await _stored_bytes(js, "acme", created.id) is None
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


async def test_a_tenant_that_stores_nothing_gets_store_false_and_no_background(stack, js):
    client = _client(stack, UNSTORED_KEY)
    created = await client.responses.create(model=MODEL, input="hi", store=True)
    assert created.model_extra["store"] is False
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, input="hi", background=True)
    assert err.value.body["param"] == "background"
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    assert await _stored_bytes(js, "quiet", created.id) is None


async def test_retention_is_the_stores_ttl(stack, js):
    """A tenant keeping responses 2 s: the server itself drops the message (per-message TTL)."""
    client = _client(stack, SHORT_KEY)
    created = await client.responses.create(model=MODEL, input="hi")
    msg = None

    async def stored() -> bool:
        nonlocal msg
        try:
            msg = await js.get_last_msg(STREAM, f"$KV.{BUCKET}.{stored_response_key('brief', created.id)}")
        except nats.js.errors.NotFoundError:
            return False
        return True

    assert await eventually(stored)
    assert msg.headers["Nats-TTL"] == "2"
    assert await eventually(lambda: _gone(js, "brief", created.id))
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


# -- tenants ------------------------------------------------------------------------------------------
async def test_another_tenants_key_finds_nothing(stack, js):
    """Each route with the other tenant's key answers as for an unknown id, and its DELETE removes
    nothing; a previous_response_id of another tenant is not found either."""
    owner, other = _client(stack), _client(stack, OTHER_KEY)
    created = await owner.responses.create(model=MODEL, input="the owner's words")
    await _retrieved(owner, created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.input_items.list(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as err:
        await other.responses.create(model=MODEL, input="go on", previous_response_id=created.id)
    assert err.value.body["param"] == "previous_response_id"
    assert (await owner.responses.retrieve(created.id)).id == created.id  # still there
    async with httpx.AsyncClient(base_url=stack.url) as http:  # ids that no key may hold
        for bad in ("a.b", "*", ">", "acme.x"):
            r = await http.get(f"/v1/responses/{bad}", headers={"Authorization": f"Bearer {OTHER_KEY}"})
            assert r.status_code == 404, bad


# -- previous_response_id -------------------------------------------------------------------------------
async def test_previous_response_id_gives_the_engine_the_whole_history(stack, engine):
    client = _client(stack)
    first = await client.responses.create(
        model=MODEL, input="My name is Ada.", instructions="Be terse.", max_output_tokens=5
    )
    await _retrieved(client, first.id)
    second = await client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=5
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    seen = engine.seen[-1].messages
    # The first turn's instructions are not carried over (as OpenAI); its input and output are.
    assert [(m.role, m.content) for m in seen] == [
        ("user", "My name is Ada."),
        ("assistant", first.output_text),
        ("user", "What is my name?"),
    ]
    await _retrieved(client, second.id)
    third = await client.responses.create(
        model=MODEL, input="And again?", previous_response_id=second.id, max_output_tokens=5
    )
    assert [m.content for m in engine.seen[-1].messages] == [
        "My name is Ada.",
        first.output_text,
        "What is my name?",
        second.output_text,
        "And again?",
    ]
    # Each response lists only its own input.
    items = await client.responses.input_items.list(third.id)
    assert [i.content[0].text for i in items.data] == ["And again?"]


async def test_the_openapi_document_lists_the_stored_routes(stack):
    async with httpx.AsyncClient(base_url=stack.url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert "get" in paths["/v1/responses/{response_id}/input_items"]
    assert "post" in paths["/v1/responses/{response_id}/cancel"]
    assert set(paths["/v1/conversations/{conversation_id}/items/{item_id}"]) == {"get", "delete"}


async def test_every_stored_route_wants_a_key(stack):
    async with httpx.AsyncClient(base_url=stack.url) as http:
        for method, path in [
            ("GET", "/v1/responses/resp_x"),
            ("DELETE", "/v1/responses/resp_x"),
            ("GET", "/v1/responses/resp_x/input_items"),
            ("POST", "/v1/responses/resp_x/cancel"),
            ("POST", "/v1/conversations"),
            ("GET", "/v1/conversations/conv_x/items"),
            ("DELETE", "/v1/conversations/conv_x/items/msg_x"),
        ]:
            answer = await http.request(method, path, headers={"Authorization": "Bearer sk-wrong"})
            assert answer.status_code == 401, (method, path)
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
