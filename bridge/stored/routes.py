"""The stored responses' routes: `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`. Every lookup is under the caller's tenant: another
tenant's id is not found, as an unknown one is."""

from __future__ import annotations

import orjson
from aiohttp import web

from bridge.chat import authenticate
from bridge.errors import EdgeError
from bridge.stored.items import MAX_PAGE, page
from bridge.stored.store import ResponseStore
from core.catalogue import Catalogue
from schemas.errors import ErrorCode
from schemas.stored import StoredResponse


def not_found(response_id: str, param: str | None = None) -> EdgeError:
    """Unknown, deleted, expired and another tenant's ids all read the same."""
    return EdgeError(ErrorCode.invalid_request, f"No response found with id '{response_id}'.", param,
                     status=404, code_name="not_found")


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


class StoredRoutes:
    def __init__(self, store: ResponseStore, catalogue: Catalogue) -> None:
        self.store = store
        self.catalogue = catalogue

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_delete("/v1/responses/{response_id}", self.delete)
        app.router.add_get("/v1/responses/{response_id}/input_items", self.input_items)

    async def _found(self, request: web.Request) -> tuple[str, str, StoredResponse, int]:
        tenant = authenticate(request, self.catalogue.tenants)
        response_id = request.match_info["response_id"]
        found = await self.store.get(tenant.name, response_id)
        if found is None:
            raise not_found(response_id)
        return tenant.name, response_id, *found

    async def retrieve(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        return _json(record.response)

    async def delete(self, request: web.Request) -> web.Response:
        tenant, response_id, _, _ = await self._found(request)
        await self.store.delete(tenant, response_id)
        return _json(orjson.dumps({"id": response_id, "object": "response", "deleted": True}))

    async def input_items(self, request: web.Request) -> web.Response:
        _, _, record, _ = await self._found(request)
        q = request.query
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise EdgeError(ErrorCode.invalid_request, "order must be 'asc' or 'desc'", "order")
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE:
            raise EdgeError(ErrorCode.invalid_request, f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
        items = orjson.loads(record.input_items)
        return _json(orjson.dumps(page(items, after=q.get("after"), limit=limit, order=order)))
