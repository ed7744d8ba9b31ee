"""`POST /v1/batches`, `GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`
(OpenAI's shapes). Creating a batch stores its record, `validating`, and returns: a runner takes
it from there (`runner.py`). Every route is the caller's tenant's alone."""

from __future__ import annotations

import re
import time
import uuid

import msgspec
from aiohttp import web

from bridge.auth import authenticate
from bridge.batch.store import BatchStore
from bridge.errors import EdgeError, not_found, unanalysed
from bridge.files.routes import json_response
from bridge.files.store import FileStore
from bridge.paging import page_query, window
from core.catalogue import Catalogue
from core.policy.tenants import Tenant
from schemas.batches import ENDPOINTS, Batch, BatchList, BatchState, CreateBatch, RequestCounts
from schemas.checks import MAX_TIMEOUT_S
from schemas.errors import ErrorCode

_decode_create = msgspec.json.Decoder(CreateBatch).decode
# OpenAI offers "24h"; shorter windows (a number of hours or minutes) are Laneway's: a back-fill that
# must be done by morning, or a test that must see a batch expire.
_WINDOW = re.compile(r"^([1-9][0-9]*)([hm])$")


def window_s(window: str) -> int:
    match = _WINDOW.match(window)
    seconds = int(match.group(1)) * (3600 if match.group(2) == "h" else 60) if match else 0
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise EdgeError(
            ErrorCode.invalid_request,
            f"completion_window must be '24h' or shorter (a number of "
            f"hours or minutes, like '6h' or '30m'), not {window!r}",
            "completion_window",
        )
    return seconds


class BatchesApi:
    def __init__(self, store: BatchStore, files: FileStore, catalogue: Catalogue, klass: str = "batch") -> None:
        self.store = store
        self.files = files
        self.catalogue = catalogue
        self.klass = klass

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.list)
        app.router.add_get("/v1/batches/{batch_id}", self.retrieve)
        app.router.add_post("/v1/batches/{batch_id}/cancel", self.cancel)

    async def create(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        try:
            ask = _decode_create(await request.read())
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise EdgeError(ErrorCode.invalid_request, f"not a valid batch: {exc}") from None
        if ask.metadata and tenant.pii.looks:  # no generation carries it past the PII stage
            raise unanalysed("a batch's metadata", "metadata", "leave it out")
        if ask.endpoint not in ENDPOINTS:
            raise EdgeError(ErrorCode.invalid_request, f"endpoint must be one of {list(ENDPOINTS)}", "endpoint")
        self._check_class(tenant)
        seconds = window_s(ask.completion_window)
        file = await self.files.get(tenant.name, ask.input_file_id)
        if file is None:
            raise not_found("file", ask.input_file_id, "input_file_id")
        if file.purpose != "batch":
            raise EdgeError(
                ErrorCode.invalid_request,
                f"the input file's purpose is {file.purpose!r}; a batch reads files uploaded with purpose 'batch'",
                "input_file_id",
            )
        now = int(time.time())
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            endpoint=ask.endpoint,
            input_file_id=file.id,
            completion_window=ask.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + seconds,
            request_counts=RequestCounts(),
            metadata=ask.metadata,
        )
        await self.store.create(BatchState(tenant=tenant.name, batch=batch))
        return json_response(batch)

    def _check_class(self, tenant: Tenant) -> None:
        if self.klass not in self.catalogue.classes:
            raise EdgeError(ErrorCode.unknown_class, f"this deployment has no {self.klass!r} class to run batches in")
        if not tenant.may_use(self.klass):
            raise EdgeError(
                ErrorCode.class_not_allowed, f"this API key may not use class {self.klass!r}, which batches run in"
            )

    async def _state(self, request: web.Request) -> BatchState:
        tenant = authenticate(request, self.catalogue.tenants)
        batch_id = request.match_info["batch_id"]
        state = await self.store.get(tenant.name, batch_id)
        if state is None:
            raise not_found("batch", batch_id, "batch_id")
        return state

    async def retrieve(self, request: web.Request) -> web.Response:
        return json_response((await self._state(request)).batch)

    async def list(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        batches = [state.batch for state in await self.store.list(tenant.name)]
        after, limit, order = page_query(request, 20, 100)
        shown, more = window(batches, [b.id for b in batches], after, limit, order)
        return json_response(
            BatchList(
                shown, has_more=more, first_id=shown[0].id if shown else None, last_id=shown[-1].id if shown else None
            )
        )

    async def cancel(self, request: web.Request) -> web.Response:
        """`cancelling` now; `cancelled` once the runner has stopped the lines in flight and written
        the files of what finished. A batch already done stays as it is (OpenAI answers the same)."""
        state = await self._state(request)

        def cancelling(current: BatchState) -> BatchState | None:
            if current.batch.status not in ("validating", "in_progress"):
                return None
            batch = msgspec.structs.replace(current.batch, status="cancelling", cancelling_at=int(time.time()))
            return msgspec.structs.replace(current, batch=batch)

        updated = await self.store.update(state.tenant, state.batch.id, cancelling)
        return json_response((updated or state).batch)
