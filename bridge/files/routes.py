"""The Files API (OpenAI's shapes): `POST /v1/files` (multipart: `file`, `purpose`,
`expires_after[anchor]`, `expires_after[seconds]`), `GET /v1/files`, `GET|DELETE /v1/files/{id}`,
`GET /v1/files/{id}/content`. Every route is the caller's tenant's alone: another tenant's id is
answered as an unknown one.

An upload is read here, not by the app's body middleware: a file may be far larger than a chat
body (`max_file_bytes`), and it is bounded in size, time and the tenant's storage quota while it
streams, chunk by chunk, into the object store: the bridge holds one chunk of it at a time. Its
time is the body timeout, and one second more for each `MIN_UPLOAD_RATE` bytes it has delivered:
a large file at any real speed arrives whole, and a body trickled a byte at a time is cut as a
chat's is (a flat 600 s held a trickling connection that long)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import BodyPartReader, web

from bridge.auth import authenticate
from bridge.errors import EdgeError, body_timeout, not_found, storage_refused
from bridge.files.store import FileStore, new_file_id
from bridge.files.upload import CHUNK_BYTES
from bridge.paging import page_query, window
from core.catalogue import Catalogue
from core.policy.storage_quota import StorageExceeded
from core.policy.tenants import Tenant
from schemas import codec
from schemas.batches import UPLOAD_PURPOSES, Deleted, FileList, FileObject
from schemas.errors import ErrorCode

MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch's input file
EXPIRES_AFTER_S = (3600, 30 * 86_400)  # OpenAI's bounds for expires_after[seconds]
MAX_LIST = 10_000
MIN_UPLOAD_RATE = 64 * 1024  # bytes a second: 512 kbit/s, slower than any real uplink
MAX_FIELD_BYTES = 4096  # a form field besides the file: `purpose`, `expires_after[...]`
HOLD_SLACK_S = 60  # a hold outlives the time its bytes may take by this, then lapses


def _invalid(message: str, param: str | None = None) -> EdgeError:
    return EdgeError(ErrorCode.invalid_request, message, param)


def is_upload(request: web.Request) -> bool:
    """A file upload streams in through its route, under its own size and time bounds."""
    return request.method == "POST" and request.path == "/v1/files"


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=codec.encode_json(obj), status=status, content_type="application/json")


class FilesApi:
    def __init__(
        self, store: FileStore, catalogue: Catalogue, max_file_bytes: int = MAX_FILE_BYTES, body_timeout_s: float = 30.0
    ) -> None:
        self.store = store
        self.catalogue = catalogue
        self.max_file_bytes = max_file_bytes
        self.body_timeout_s = body_timeout_s

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.create)
        app.router.add_get("/v1/files", self.list)
        app.router.add_get("/v1/files/{file_id}", self.retrieve)
        app.router.add_delete("/v1/files/{file_id}", self.delete)
        app.router.add_get("/v1/files/{file_id}/content", self.content)

    async def create(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        if not request.content_type.startswith("multipart/form-data"):
            raise _invalid("upload a file as multipart/form-data with the fields 'file' and 'purpose'")
        file_id = new_file_id()
        try:
            try:
                async with asyncio.timeout(self.body_timeout_s) as clock:
                    fields, size, filename = await self._read_form(request, tenant, file_id, clock)
            except TimeoutError:
                raise body_timeout(self.body_timeout_s) from None
            purpose = fields.get("purpose")
            if purpose not in UPLOAD_PURPOSES:
                raise _invalid(f"purpose must be one of {list(UPLOAD_PURPOSES)}", "purpose")
            if size is None:
                raise _invalid("the form has no 'file' field", "file")
            if not size:
                raise _invalid("the file is empty", "file")
            file = await self.store.finish(
                tenant.name, file_id, size, filename or "upload", purpose, self._expires_after(fields)
            )
        except BaseException:  # refused, timed out, or the client went: nothing of it is kept
            await asyncio.shield(self.store.discard(tenant.name, file_id))
            raise
        return json_response(file)

    async def _read_form(
        self, request: web.Request, tenant: Tenant, file_id: str, clock: asyncio.Timeout
    ) -> tuple[dict[str, str], int | None, str | None]:
        """The form's small fields, and the file's size and name: its bytes go to the store as
        they arrive, never held here whole."""
        fields: dict[str, str] = {}
        size: int | None = None
        filename: str | None = None
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise _invalid("nested multipart bodies are not supported")
            if part.name == "file":
                if size is not None:
                    raise _invalid("the form has more than one 'file' field", "file")
                filename = part.filename
                size = await self.store.put_stream(
                    tenant.name, file_id, self._chunks(part, tenant, file_id, request.content_length, clock)
                )
            elif part.name is not None:
                fields[part.name] = (await self._read_field(part)).decode(errors="replace")[:256]
        return fields, size, filename

    async def _chunks(
        self, part: BodyPartReader, tenant: Tenant, file_id: str, length: int | None, clock: asyncio.Timeout
    ) -> AsyncIterator[bytes]:
        """The file's bytes, under the size limit, the time they may take and the tenant's storage
        quota: held first for the whole body when its length is known (a file that cannot fit is
        refused before a byte is stored), else a file's place first and its bytes in doubling
        steps as they come."""
        held = min(length, self.max_file_bytes) if length else 0
        if (refused := await self._hold(tenant, file_id, held)) is not None:
            raise refused
        size = 0
        began = asyncio.get_running_loop().time()
        while chunk := await part.read_chunk(CHUNK_BYTES):
            size += len(chunk)
            clock.reschedule(began + self.body_timeout_s + size / MIN_UPLOAD_RATE)
            if size > self.max_file_bytes:
                raise EdgeError(
                    ErrorCode.payload_too_large, f"the file is over {self.max_file_bytes} bytes, the limit", "file"
                )
            if size > held:
                held = await self._grow(tenant, file_id, size, held)
            yield chunk

    async def _grow(self, tenant: Tenant, file_id: str, size: int, held: int) -> int:
        """Hold twice as much, or (near the quota) just what has come: refused only when that
        does not fit."""
        for want in dict.fromkeys((min(max(size, 2 * held), self.max_file_bytes), size)):
            if (refused := await self._hold(tenant, file_id, want)) is None:
                return want
        assert refused is not None  # the last try's refusal
        raise refused

    async def _hold(self, tenant: Tenant, file_id: str, nbytes: int) -> EdgeError | None:
        """Hold `nbytes` for as long as they may take to arrive (a bridge that dies mid-upload
        leaves its hold no longer), or the refusal to answer with."""
        ttl_s = int(self.body_timeout_s + nbytes / MIN_UPLOAD_RATE) + HOLD_SLACK_S
        try:
            await self.store.hold(tenant.name, file_id, nbytes, ttl_s, tenant.storage)
        except StorageExceeded as exc:
            return storage_refused(exc, "file")
        return None

    @staticmethod
    async def _read_field(part: BodyPartReader) -> bytes:
        data = bytearray()
        while chunk := await part.read_chunk(MAX_FIELD_BYTES):
            data += chunk
            if len(data) > MAX_FIELD_BYTES:
                raise _invalid(f"the form field {part.name!r} is over {MAX_FIELD_BYTES} bytes", part.name)
        return bytes(data)

    @staticmethod
    def _expires_after(fields: dict[str, str]) -> int | None:
        anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
        if anchor is None and seconds is None:
            return None
        if anchor != "created_at":
            raise _invalid("expires_after[anchor] must be 'created_at'", "expires_after.anchor")
        low, high = EXPIRES_AFTER_S
        if seconds is None or not seconds.isdigit() or not low <= int(seconds) <= high:
            raise _invalid(f"expires_after[seconds] must be an integer from {low} to {high}", "expires_after.seconds")
        return int(seconds)

    async def list(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        files = await self.store.list(tenant.name)
        if (purpose := request.query.get("purpose")) is not None:
            files = [f for f in files if f.purpose == purpose]
        after, limit, order = page_query(request, MAX_LIST, MAX_LIST)
        shown, more = window(files, [f.id for f in files], after, limit, order)
        return json_response(
            FileList(
                shown, has_more=more, first_id=shown[0].id if shown else None, last_id=shown[-1].id if shown else None
            )
        )

    async def _file(self, request: web.Request) -> tuple[str, FileObject]:
        tenant = authenticate(request, self.catalogue.tenants)
        file_id = request.match_info["file_id"]
        file = await self.store.get(tenant.name, file_id)
        if file is None:
            raise not_found("file", file_id, "file_id")
        return tenant.name, file

    async def retrieve(self, request: web.Request) -> web.Response:
        return json_response((await self._file(request))[1])

    async def delete(self, request: web.Request) -> web.Response:
        tenant, file = await self._file(request)
        await self.store.delete(tenant, file.id)
        return json_response(Deleted(id=file.id, object="file"))

    async def content(self, request: web.Request) -> web.Response:
        tenant, file = await self._file(request)
        data = await self.store.content(tenant, file.id)
        if data is None:
            raise not_found("file", file.id, "file_id")
        return web.Response(body=data, content_type="application/octet-stream")
