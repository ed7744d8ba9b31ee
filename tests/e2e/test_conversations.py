"""The Conversations API over the stored responses' bucket, with the official `openai` client, and
responses created with `conversation`: the engine is handed the conversation so far, each ended
turn is appended as the engine got it (PII redacted: the stack runs the regex PII stage), items
a client adds directly (and metadata) are refused for a tenant whose policy redacts, and another tenant's key
finds nothing. The sim SIMULATES text: shapes and what the engine saw, never words."""

from __future__ import annotations

import httpx
import openai
import pytest

from core.policy.pii import TenantPiiPolicy
from core.policy.tenants import Tenant, hash_key
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack
from tests.e2e.test_stored_responses import RecordingSim
from tests.openapi import validator
from tests.wait import eventually

MODEL = "laneway-sim"
KEY, PLAIN_KEY, OTHER_KEY = "sk-conv-a", "sk-conv-plain", "sk-conv-other"
EMAIL = "ada.lovelace@example.com"


@pytest.fixture(scope="module")
async def engine():
    return RecordingSim()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    tenants = [
        Tenant(name="acme", api_key_sha256=[hash_key(KEY)]),  # the default PII policy
        Tenant(name="plain", api_key_sha256=[hash_key(PLAIN_KEY)], pii=TenantPiiPolicy(enabled=False)),
        Tenant(name="globex", api_key_sha256=[hash_key(OTHER_KEY)]),
    ]
    settings = Settings(tenants={t.name: t for t in tenants}, models={MODEL: LogicalModel(pool="sim")})
    async with Stack(nats_server.url, settings, engines=[engine], pii="regex") as s:
        yield s


def _client(stack, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


async def _items(client: openai.AsyncOpenAI, conversation_id: str, count: int) -> list:
    """The conversation's items once `count` are there (a turn is appended after its answer)."""
    listed = []

    async def enough() -> bool:
        listed[:] = (await client.conversations.items.list(conversation_id, order="asc")).data
        return len(listed) >= count

    assert await eventually(enough)
    return listed


async def test_a_conversation_is_created_read_updated_and_deleted(stack):
    client = _client(stack, PLAIN_KEY)  # metadata is kept only where nothing is redacted (below)
    created = await client.conversations.create(metadata={"topic": "billing"})
    assert created.id.startswith("conv_") and created.metadata == {"topic": "billing"}
    headers = {"Authorization": f"Bearer {PLAIN_KEY}"}
    async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
        validator("ConversationResource").validate((await http.get(f"/v1/conversations/{created.id}")).json())
        updated = await client.conversations.update(created.id, metadata={"topic": "refunds"})
        assert updated.metadata == {"topic": "refunds"}
        assert (await client.conversations.retrieve(created.id)).metadata == {"topic": "refunds"}
        deleted = (await http.delete(f"/v1/conversations/{created.id}")).json()
    validator("DeletedConversationResource").validate(deleted)
    with pytest.raises(openai.NotFoundError):
        await client.conversations.retrieve(created.id)


async def test_responses_in_a_conversation_see_it_and_extend_it_redacted(stack, engine):
    client = _client(stack)
    conversation = await client.conversations.create()
    first = await client.responses.create(
        model=MODEL, input=f"My email is {EMAIL}.", conversation=conversation.id, max_output_tokens=5
    )
    assert first.conversation.id == conversation.id
    await _items(client, conversation.id, 2)
    second = await client.responses.create(
        model=MODEL, input="What was it?", max_output_tokens=5, conversation={"id": conversation.id}
    )
    seen = engine.seen[-1].messages
    assert [m.role for m in seen] == ["user", "assistant", "user"]
    said = " ".join(seen[0].texts())
    assert "<EMAIL_ADDRESS>" in said and EMAIL not in said
    items = await _items(client, conversation.id, 4)
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2
    assert items[3].content[0].text == second.output_text
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
        listed = (await http.get(f"/v1/conversations/{conversation.id}/items")).json()
    validator("ConversationItemList").validate(listed)
    assert EMAIL not in str(listed) and "<EMAIL_ADDRESS>" in str(listed)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(
            model=MODEL, input="x", conversation=conversation.id, previous_response_id=first.id
        )
    assert err.value.body["param"] == "conversation"


async def test_items_and_metadata_added_directly_only_where_nothing_is_redacted(stack):
    client, plain = _client(stack), _client(stack, PLAIN_KEY)
    with pytest.raises(openai.BadRequestError) as err:
        await client.conversations.create(items=[{"role": "user", "content": f"mail {EMAIL}"}])
    assert err.value.body["param"] == "items"
    with pytest.raises(openai.BadRequestError) as err:
        await client.conversations.create(metadata={"customer": EMAIL})
    assert err.value.body["param"] == "metadata"
    conversation = await client.conversations.create()
    with pytest.raises(openai.BadRequestError):
        await client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as err:
        await client.conversations.update(conversation.id, metadata={"customer": EMAIL})
    assert err.value.body["param"] == "metadata"

    created = await plain.conversations.create(items=[{"role": "user", "content": "first"}])
    added = await plain.conversations.items.create(
        created.id, items=[{"role": "assistant", "content": "second"}, {"role": "user", "content": "third"}]
    )
    assert len(added.data) == 2
    items = (await plain.conversations.items.list(created.id, order="asc")).data
    assert [i.content[0].text for i in items] == ["first", "second", "third"]
    assert (await plain.conversations.items.retrieve(items[1].id, conversation_id=created.id)).id == items[1].id
    await plain.conversations.items.delete(items[1].id, conversation_id=created.id)
    left = (await plain.conversations.items.list(created.id, order="asc")).data
    assert [i.id for i in left] == [items[0].id, items[2].id]
    with pytest.raises(openai.NotFoundError):
        await plain.conversations.items.retrieve(items[1].id, conversation_id=created.id)


async def test_another_tenants_key_finds_no_conversation(stack):
    owner, other = _client(stack, PLAIN_KEY), _client(stack, OTHER_KEY)
    conversation = await owner.conversations.create(metadata={"owner": "plain"})
    with pytest.raises(openai.NotFoundError):
        await other.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        await other.conversations.items.list(conversation.id)
    with pytest.raises(openai.NotFoundError):
        await other.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError) as err:
        await other.responses.create(model=MODEL, input="hi", conversation=conversation.id)
    assert err.value.body["param"] == "conversation"
    assert (await owner.conversations.retrieve(conversation.id)).metadata == {"owner": "plain"}
    with pytest.raises(openai.NotFoundError):  # a response id is no conversation id, and back
        await owner.responses.retrieve(conversation.id)
