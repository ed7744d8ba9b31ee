"""`/v1/conversations` (OpenAI's Conversations API) over the stored responses' bucket: a
conversation is a record `<tenant>.conv_<id>` holding its items in order. A response created with
`conversation` reads them as its history and, once it has ended, appends its input (as the engine
got it: redacted) and its output (`append`).

Items a client adds directly (on create, or `POST .../items`) and the conversation's metadata
would be stored as the client sent them, never seen by the PII stage: that is only allowed for a
tenant whose PII policy redacts nothing; any other gets a 400 (and adds its turns through
responses). Every lookup is under the caller's tenant (404 otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Annotated, Any

import msgspec
import nats.errors
import orjson
from aiohttp import web
from msgspec import Meta

from bridge.auth import authenticate
from bridge.errors import EdgeError, not_found, storage_refused, unanalysed
from bridge.responses.stored.items import page, to_items
from bridge.responses.stored.routes import json_answer, paged
from bridge.responses.stored.store import Conflict, ResponseStore
from bridge.responses.translate import item_messages
from core.catalogue import Catalogue
from core.policy.storage_quota import StorageExceeded
from core.policy.tenants import Tenant
from schemas.errors import ErrorCode
from schemas.openai import Message
from schemas.stored import CONVERSATION_PREFIX, StoredConversation

log = logging.getLogger("laneway.bridge")

MAX_NEW_ITEMS = 20  # as OpenAI: items per create or add
APPEND_TRIES = 5  # concurrent appends to one conversation: compare-and-set, retried
Metadata = Annotated[dict[str, Annotated[str, Meta(max_length=512)]], Meta(max_length=16)]


class ConversationBody(msgspec.Struct, forbid_unknown_fields=True):
    items: Annotated[list[dict[str, Any]], Meta(max_length=MAX_NEW_ITEMS)] | None = None
    metadata: Metadata | None = None


class ItemsBody(msgspec.Struct, forbid_unknown_fields=True):
    items: Annotated[list[dict[str, Any]], Meta(min_length=1, max_length=MAX_NEW_ITEMS)]


def _decode(raw: bytes, kind: type) -> Any:
    try:
        return msgspec.json.decode(raw or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise EdgeError(ErrorCode.invalid_request, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise EdgeError(ErrorCode.invalid_request, f"the body is not valid JSON: {exc}") from None


def _check_metadata(tenant: Tenant, body: ConversationBody) -> None:
    """Metadata no generation carries past the PII stage: kept only where the policy looks for nothing."""
    if body.metadata and tenant.pii.looks:
        raise unanalysed(
            "a conversation's metadata", "metadata", "leave it out (a response's metadata is analysed and kept)"
        )


class Conversations:
    def __init__(self, store: ResponseStore, catalogue: Catalogue) -> None:
        self.store = store
        self.catalogue = catalogue

    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/conversations", self.create)
        r.add_get("/v1/conversations/{conversation_id}", self.retrieve)
        r.add_post("/v1/conversations/{conversation_id}", self.update)
        r.add_delete("/v1/conversations/{conversation_id}", self.delete)
        r.add_get("/v1/conversations/{conversation_id}/items", self.list_items)
        r.add_post("/v1/conversations/{conversation_id}/items", self.add_items)
        r.add_get("/v1/conversations/{conversation_id}/items/{item_id}", self.get_item)
        r.add_delete("/v1/conversations/{conversation_id}/items/{item_id}", self.delete_item)

    # -- what responses use -------------------------------------------------------------------
    async def history(self, tenant: str, conversation_id: str) -> list[Message]:
        found = await self.store.get_conversation(tenant, conversation_id)
        if found is None:
            raise not_found("conversation", conversation_id, "conversation")
        return item_messages(orjson.loads(found[0].items), "conversation")

    async def append(
        self, tenant: Tenant, conversation_id: str, messages: list[Message], output: list[dict[str, Any]]
    ) -> None:
        """Add a response's input and output to the conversation (after its other writers)."""
        for _ in range(APPEND_TRIES):
            found = await self.store.get_conversation(tenant.name, conversation_id)
            if found is None:
                return  # deleted meanwhile
            record, revision = found
            new = [*to_items(messages, conversation_id[len(CONVERSATION_PREFIX) :], record.next_item), *output]
            try:
                await self._put(
                    tenant, conversation_id, record, [*orjson.loads(record.items), *new], after=revision, added=len(new)
                )
                return
            except Conflict:
                continue
        log.warning("conversation %s: items not appended after %d tries", conversation_id, APPEND_TRIES)

    def append_later(
        self, tenant: Tenant, conversation_id: str, messages: list[Message], output: list[dict[str, Any]]
    ) -> asyncio.Task[None]:
        """`append` in a task of its own (`ResponseStore.detach`), failures logged: its task."""
        return self.store.detach(
            self._append_logged(tenant, conversation_id, messages, output), f"append-{conversation_id}"
        )

    async def _append_logged(self, *args: Any) -> None:
        try:
            await self.append(*args)
        except nats.errors.Error as exc:
            log.warning("conversation items not appended: %s", type(exc).__name__)

    # -- the routes ---------------------------------------------------------------------------------
    async def _put(
        self,
        tenant: Tenant,
        conversation_id: str,
        record: StoredConversation,
        items: list[dict[str, Any]],
        *,
        after: int | None,
        added: int = 0,
        conversation: bytes | None = None,
    ) -> None:
        await self.store.put(
            tenant.name,
            conversation_id,
            StoredConversation(
                conversation=conversation or record.conversation,
                items=orjson.dumps(items),
                next_item=record.next_item + added,
            ),
            tenant.responses.retention_s,
            after=after,
        )

    async def _found(self, request: web.Request) -> tuple[Tenant, str, StoredConversation, int]:
        tenant = authenticate(request, self.catalogue.tenants)
        cid = request.match_info["conversation_id"]
        found = await self.store.get_conversation(tenant.name, cid)
        if found is None:
            raise not_found("conversation", cid)
        return tenant, cid, *found

    def _client_items(self, tenant: Tenant, cid: str, items: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
        if tenant.pii.looks:
            raise unanalysed("items added directly", "items", "add turns with POST /v1/responses and conversation")
        return to_items(item_messages(items, "items"), cid[len(CONVERSATION_PREFIX) :], start)

    async def create(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        body = _decode(await request.read(), ConversationBody)
        _check_metadata(tenant, body)
        try:
            await self.store.budget.admit(tenant.name, tenant.storage)
        except StorageExceeded as exc:
            raise storage_refused(exc, None, "delete stored responses or conversations") from None
        cid = f"{CONVERSATION_PREFIX}{uuid.uuid4().hex}"
        items = self._client_items(tenant, cid, body.items, 0) if body.items else []
        conversation = orjson.dumps(
            {"id": cid, "object": "conversation", "created_at": int(time.time()), "metadata": body.metadata or {}}
        )
        await self._put(tenant, cid, StoredConversation(conversation=conversation), items, after=0, added=len(items))
        return json_answer(conversation)

    async def retrieve(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        return json_answer(record.conversation)

    async def update(self, request: web.Request) -> web.Response:
        tenant, cid, record, revision = await self._found(request)
        body = _decode(await request.read(), ConversationBody)
        if body.items is not None or body.metadata is None:
            raise EdgeError(ErrorCode.invalid_request, "an update sets metadata, and only metadata", "metadata")
        _check_metadata(tenant, body)
        conversation = orjson.dumps({**orjson.loads(record.conversation), "metadata": body.metadata})
        await self._put(tenant, cid, record, orjson.loads(record.items), after=revision, conversation=conversation)
        return json_answer(conversation)

    async def delete(self, request: web.Request) -> web.Response:
        tenant, cid, _, _ = await self._found(request)
        await self.store.delete(tenant.name, cid)
        return json_answer(orjson.dumps({"id": cid, "object": "conversation.deleted", "deleted": True}))

    async def list_items(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        return paged(record.items, request)

    async def add_items(self, request: web.Request) -> web.Response:
        tenant, cid, record, revision = await self._found(request)
        body = _decode(await request.read(), ItemsBody)
        new = self._client_items(tenant, cid, body.items, record.next_item)
        await self._put(tenant, cid, record, [*orjson.loads(record.items), *new], after=revision, added=len(new))
        return json_answer(orjson.dumps(page(new, after=None, limit=len(new) or 1, order="asc")))

    async def get_item(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        item_id = request.match_info["item_id"]
        item = next((i for i in orjson.loads(record.items) if i["id"] == item_id), None)
        if item is None:
            raise EdgeError(
                ErrorCode.invalid_request, f"No item found with id '{item_id}'.", status=404, code_name="not_found"
            )
        return json_answer(orjson.dumps(item))

    async def delete_item(self, request: web.Request) -> web.Response:
        """Removes the item; answers with the conversation, as OpenAI does."""
        tenant, cid, record, revision = await self._found(request)
        item_id = request.match_info["item_id"]
        items = orjson.loads(record.items)
        kept = [i for i in items if i["id"] != item_id]
        if len(kept) == len(items):
            raise EdgeError(
                ErrorCode.invalid_request, f"No item found with id '{item_id}'.", status=404, code_name="not_found"
            )
        await self._put(tenant, cid, record, kept, after=revision)
        return json_answer(record.conversation)
