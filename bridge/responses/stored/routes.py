"""The stored responses' routes: `GET /v1/responses/{id}` (`?stream=true&starting_after=N`: a
streamed background response's events from the store), `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`. Every lookup is under
the caller's tenant: another tenant's id is not found, as an unknown one is."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from bridge.auth import authenticate
from bridge.errors import EdgeError, not_found
from bridge.paging import page_query, query_int
from bridge.responses.stored.background import FLUSH_S, mark_lost
from bridge.responses.stored.items import MAX_PAGE, page
from bridge.responses.stored.lifecycle import ended, running, stale
from bridge.responses.stored.store import Conflict, ResponseStore
from core.catalogue import Catalogue
from core.policy.tenants import Tenant
from core.tasks import pause
from schemas.errors import ErrorCode
from schemas.stored import StoredResponse

CANCEL_TRIES = 3


def json_answer(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def paged(items: bytes, request: web.Request) -> web.Response:
    """A page of stored items (a JSON list) as the query asks: `order` (desc by default), `after`,
    `limit` (20 by default)."""
    after, limit, order = page_query(request, 20, MAX_PAGE)
    return json_answer(orjson.dumps(page(orjson.loads(items), after=after, limit=limit, order=order)))


class StoredRoutes:
    def __init__(
        self, store: ResponseStore, catalogue: Catalogue, cancel: Callable[[str, str], Awaitable[None]]
    ) -> None:
        self.store = store
        self.catalogue = catalogue
        self._cancel = cancel

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_delete("/v1/responses/{response_id}", self.delete)
        app.router.add_get("/v1/responses/{response_id}/input_items", self.input_items)
        app.router.add_post("/v1/responses/{response_id}/cancel", self.cancel)

    async def _found(self, request: web.Request) -> tuple[Tenant, str, StoredResponse, int]:
        tenant = authenticate(request, self.catalogue.tenants)
        response_id = request.match_info["response_id"]
        found = await self._current(tenant, response_id)
        if found is None:
            raise not_found("response", response_id)
        return tenant, response_id, *found

    async def _current(self, tenant: Tenant, response_id: str) -> tuple[StoredResponse, int] | None:
        """The record, a lost background one marked failed on the way (unless another bridge
        can run it again, its request still listed: `takeover.py` does)."""
        found = await self.store.get(tenant.name, response_id)
        if (
            found is not None
            and stale(found[0], time.time())
            and (not found[0].rerunnable or await self.store.listed(tenant.name, response_id) is None)
        ):
            record = await mark_lost(
                self.store, self._cancel, tenant.name, response_id, *found, tenant.responses.retention_s
            )
            return await self.store.get(tenant.name, response_id) or (record, found[1])
        return found

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        tenant, response_id, record, _ = await self._found(request)
        if request.query.get("stream", "false").lower() != "true":
            return json_answer(record.response)
        after = query_int(request.query.get("starting_after"), -1, "starting_after", -1, 2**53)
        if not record.events and not running(record):
            raise EdgeError(
                ErrorCode.invalid_request,
                "only a background response created with stream: true can be streamed again",
                "stream",
            )
        return await self.follow(request, tenant, response_id, after)

    async def follow(
        self, request: web.Request, tenant: Tenant, response_id: str, after: int, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        """The stored events after sequence number `after`, then new ones as the running response
        stores them, until it ends."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **(headers or {})}
        )
        await response.prepare(request)
        next_seq = after + 1
        try:
            while (found := await self._current(tenant, response_id)) is not None:
                record = found[0]
                fresh = record.events[max(0, next_seq - record.first_event) :]
                if fresh:
                    await response.write(b"".join(fresh))
                    next_seq = record.first_event + len(record.events)
                if not running(record):
                    break
                await pause(FLUSH_S)  # the runner writes at most this often
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; the response runs on (it is a background one)
        return response

    async def delete(self, request: web.Request) -> web.Response:
        tenant, response_id, _, _ = await self._found(request)
        await self.store.delete(tenant.name, response_id)
        return json_answer(orjson.dumps({"id": response_id, "object": "response", "deleted": True}))

    async def input_items(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        return paged(record.input_items, request)

    async def cancel(self, request: web.Request) -> web.Response:
        """Mark a running background response cancelled and stop its generation; an ended one is
        answered as it is."""
        tenant, response_id, record, revision = await self._found(request)
        if not orjson.loads(record.response).get("background"):
            raise EdgeError(ErrorCode.invalid_request, "only a background response can be cancelled")
        for _ in range(CANCEL_TRIES):
            if not running(record):
                return json_answer(record.response)
            cancelled = ended(record, "cancelled")
            try:
                await self.store.put(tenant.name, response_id, cancelled, tenant.responses.retention_s, after=revision)
            except Conflict:  # its runner wrote in between: look again
                found = await self.store.get(tenant.name, response_id)
                if found is None:
                    raise not_found("response", response_id) from None
                record, revision = found
                continue
            await self._cancel(tenant.name, record.request_id)
            return json_answer(cancelled.response)
        raise EdgeError(ErrorCode.unavailable, "the response kept changing; retry the cancel")
