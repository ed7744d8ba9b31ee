"""Where files live: their bytes in JetStream's Object Store (`lw_file_data`), their OpenAI file
objects in a KV bucket (`lw_files`), both under `<tenant>.<file_id>`. No new server: JetStream
encrypts both at rest with the rest of Laneway's data.

Only the bridges hold these buckets (their runtime state, created here like the broker creates
its cache): a tenant's NATS account has no JetStream at all, so over NATS nobody but Laneway's
services reads a file, and over HTTP every lookup is keyed by the caller's tenant.
"""

from __future__ import annotations

import time
import uuid

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from core.kvwatch import current_values
from schemas.batches import FileObject, FilePurpose
from schemas.subjects import BadToken, Subjects, tenant_key

FILES_BUCKET = "files"              # lw_files: file objects
FILE_DATA_BUCKET = "file_data"      # lw_file_data: their bytes
_decode = msgspec.json.Decoder(FileObject).decode


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def _key(tenant: str, file_id: str) -> str:
    return tenant_key(tenant, "file id", file_id)


class FileStore:
    def __init__(self, meta: KeyValue, data: ObjectStore) -> None:
        self.meta = meta
        self.data = data

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1) -> FileStore:
        meta = await js.create_key_value(KeyValueConfig(bucket=s.bucket(FILES_BUCKET), history=1,
                                                        storage=StorageType.FILE, replicas=replicas))
        data = await js.create_object_store(s.bucket(FILE_DATA_BUCKET), ObjectStoreConfig(
            storage=StorageType.FILE, replicas=replicas))
        return cls(meta, data)

    async def put(self, tenant: str, content: bytes, filename: str, purpose: FilePurpose,
                  expires_after_s: int | None = None, file_id: str | None = None) -> FileObject:
        """Bytes first, then the file object: a file is listed only once its bytes are whole. The
        same `file_id` again replaces the file (a batch's outputs, finalized twice)."""
        now = int(time.time())
        file = FileObject(id=file_id or new_file_id(), bytes=len(content), created_at=now, filename=filename,
                          purpose=purpose, status="processed", expires_at=now + expires_after_s if expires_after_s else None)
        await self.data.put(_key(tenant, file.id), content)
        await self.meta.put(_key(tenant, file.id), msgspec.json.encode(file))
        return file

    async def get(self, tenant: str, file_id: str) -> FileObject | None:
        """The tenant's file; None for an unknown id, another tenant's, or an expired one."""
        try:
            entry = await self.meta.get(_key(tenant, file_id))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, BadToken):
            return None
        file = _decode(entry.value)
        if file.expires_at is not None and file.expires_at <= time.time():
            await self.delete(tenant, file_id)
            return None
        return file

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        if await self.get(tenant, file_id) is None:
            return None
        try:
            return (await self.data.get(_key(tenant, file_id))).data
        except nats.js.errors.ObjectNotFoundError:
            return None

    async def delete(self, tenant: str, file_id: str) -> bool:
        """Really gone: the object's chunks are purged from the stream, the file object's key too."""
        try:
            key = _key(tenant, file_id)
            await self.meta.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, BadToken):
            return False
        try:
            await self.data.delete(key)
        except nats.js.errors.ObjectNotFoundError:
            pass
        await self.meta.purge(key)
        return True

    async def list(self, tenant: str) -> list[FileObject]:
        """The tenant's files, oldest first (ids are random: created_at orders them)."""
        files = await self._all(tenant)
        now = time.time()
        live = [f for f in files if f.expires_at is None or f.expires_at > now]
        return sorted(live, key=lambda f: (f.created_at, f.id))

    async def _all(self, tenant: str) -> list[FileObject]:
        return [_decode(value) for value in await current_values(self.meta, f"{tenant}.*")]
