"""Where files live: their bytes in JetStream's Object Store (`lw_file_data`), their OpenAI file
objects in a KV bucket (`lw_files`), both under `<tenant>.<file_id>`. No new server: JetStream
encrypts both at rest with the rest of Laneway's data.

A tenant's files are bounded by its storage quota (`core/policy/storage_quota.py`): an upload
first writes a hold for the bytes it may still write (`<tenant>.<file_id>.hold`, with a TTL, so a
bridge that dies mid-upload leaves none for long), then counts what the tenant keeps besides:
its files and the holds written before its own (lower revisions), and refuses if that is over.
Holding before counting keeps the quota under concurrency, across bridges too: of two uploads
racing, the one whose hold came later counts the other's, so they are never both kept, and the
earlier one is not refused for the later. A hold grows as the bytes stream in, by the same rule
(a new revision: it now counts every other hold), and gives way to the file object once the
bytes are whole.

An upload's chunks are written under its own name (`up.<tenant>.<file_id>`), so a bridge killed
mid-upload leaves chunks that say whose they are: once neither the file object nor the upload's
hold exists (the hold lapses when the upload could no longer be running), `sweep_uploads`
purges them.

Only the bridges hold these buckets (their runtime state, created here like the broker creates
its cache): a tenant's NATS account has no JetStream at all, so over NATS nobody but Laneway's
services reads a file, and over HTTP every lookup is keyed by the caller's tenant.
"""

from __future__ import annotations

import builtins
import io
import logging
import time
import uuid
from collections.abc import AsyncIterable

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from bridge.files.upload import chunk_subject_of, put_chunks
from core.kvwatch import current_entries, current_keys, current_values
from core.policy.storage_quota import StorageQuota, over_files
from schemas.batches import FileObject, FilePurpose
from schemas.subjects import STORAGE_BUCKET, BadToken, Subjects, tenant_key
from schemas.usage import StorageUsage

log = logging.getLogger("laneway.bridge")

FILES_BUCKET = "files"  # lw_files: file objects
FILE_DATA_BUCKET = "file_data"  # lw_file_data: their bytes
PURGE_MARKER_TTL_S = 1  # a released hold leaves nothing behind for long
HOLD = "hold"  # `<tenant>.<file_id>.hold`: an upload's bytes still to come
UPLOAD_CHUNKS = "up"  # an upload's chunks: `$O.lw_file_data.C.up.<tenant>.<file_id>`
SWEEP_EVERY_S = 300.0  # how often a bridge looks for uploads cut off (each bridge: idempotent)
_decode = msgspec.json.Decoder(FileObject).decode


class Hold(msgspec.Struct, frozen=True):
    bytes: int


class Held(msgspec.Struct, frozen=True):
    """What a tenant keeps in files now: its file objects and its uploads' holds."""

    bytes: int = 0
    files: int = 0


_decode_hold = msgspec.json.Decoder(Hold).decode


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def _key(tenant: str, file_id: str) -> str:
    return tenant_key(tenant, "file id", file_id)


def _hold_key(tenant: str, file_id: str) -> str:
    return f"{tenant}.{file_id}.{HOLD}"


class FileStore:
    def __init__(self, meta: KeyValue, data: ObjectStore, usage: KeyValue) -> None:
        self.meta = meta
        self.data = data
        self.usage = usage  # lw_storage: each tenant's `StorageUsage`, for `laneway usage`

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1) -> FileStore:
        meta = await js.create_key_value(
            KeyValueConfig(bucket=s.bucket(FILES_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas)
        )
        data = await js.create_object_store(
            s.bucket(FILE_DATA_BUCKET), ObjectStoreConfig(storage=StorageType.FILE, replicas=replicas)
        )
        usage = await js.create_key_value(
            KeyValueConfig(bucket=s.bucket(STORAGE_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas)
        )
        return cls(meta, data, usage)

    async def put(
        self,
        tenant: str,
        content: bytes,
        filename: str,
        purpose: FilePurpose,
        expires_after_s: int | None = None,
        file_id: str | None = None,
    ) -> FileObject:
        """Bytes first, then the file object: a file is listed only once its bytes are whole. The
        same `file_id` again replaces the file (a batch's outputs, finalized twice)."""
        now = int(time.time())
        file = FileObject(
            id=file_id or new_file_id(),
            bytes=len(content),
            created_at=now,
            filename=filename,
            purpose=purpose,
            status="processed",
            expires_at=now + expires_after_s if expires_after_s else None,
        )
        await self.data.put(_key(tenant, file.id), content)
        await self.meta.put(_key(tenant, file.id), msgspec.json.encode(file))
        await self.count(tenant)
        return file

    async def hold(self, tenant: str, file_id: str, nbytes: int, ttl_s: int, quota: StorageQuota) -> None:
        """Hold `nbytes` for the upload of `file_id` (replacing its hold so far), or raise
        `StorageExceeded` (and hold nothing) when the tenant would be over its quota."""
        ack = await self.meta._js.publish(
            f"{self.meta._pre}{_hold_key(tenant, file_id)}",  # put has no TTL
            msgspec.json.encode(Hold(nbytes)),
            msg_ttl=ttl_s,
        )
        held = await self.held(tenant, holds_before=ack.seq)
        if (refused := over_files(quota, held.bytes, held.files, nbytes)) is not None:
            await self.release(tenant, file_id)
            raise refused

    async def release(self, tenant: str, file_id: str) -> None:
        await self.meta.purge(_hold_key(tenant, file_id), msg_ttl=PURGE_MARKER_TTL_S)

    async def held(self, tenant: str, holds_before: int | None = None) -> Held:
        """What the tenant keeps: its files, and its uploads' holds (only those written before
        revision `holds_before`, when given). An expired file still stored is removed here, and
        not counted."""
        total, count, expired, now = 0, 0, [], time.time()
        for entry in await current_entries(self.meta, f"{tenant}.>"):
            if not entry.value:
                continue
            tokens = entry.key.split(".")
            if len(tokens) == 3 and tokens[2] == HOLD:
                assert entry.revision is not None  # a watched entry is a stored message
                if holds_before is None or entry.revision < holds_before:
                    total, count = total + _decode_hold(entry.value).bytes, count + 1
            elif len(tokens) == 2:
                file = _decode(entry.value)
                if file.expires_at is not None and file.expires_at <= now:
                    expired.append(file.id)
                else:
                    total, count = total + file.bytes, count + 1
        for file_id in expired:
            await self._remove(tenant, file_id)
        return Held(total, count)

    async def count(self, tenant: str) -> None:
        """Write down what the tenant keeps now, for `laneway usage`. A failed write is logged:
        the next change writes it again."""
        try:
            held = await self.held(tenant)
            await self.usage.put(tenant, msgspec.json.encode(StorageUsage(held.bytes, held.files, time.time())))
        except nats.errors.Error as exc:
            log.warning("storage of tenant %s not counted: %s", tenant, type(exc).__name__)

    async def put_stream(self, tenant: str, file_id: str, chunks: AsyncIterable[bytes]) -> int:
        """The upload's bytes, chunk by chunk as they arrive; its size. Nothing is listed until
        `finish` writes the file object."""
        return await put_chunks(self.data, _key(tenant, file_id), chunks, f"{UPLOAD_CHUNKS}.{_key(tenant, file_id)}")

    async def sweep_uploads(self) -> int:
        """Purge what uploads cut off by a killed bridge left: chunks (or a whole object) with
        neither a file object nor a live hold. The chunk subjects are listed before the keys are
        read: an upload running at the listing wrote its hold before its first chunk and keeps it
        until its file object is written, so it is in what is read next. Returns how many."""
        prefix = chunk_subject_of(self.data, f"{UPLOAD_CHUNKS}.")
        listed = await self.data._js.stream_info(self.data._stream, subjects_filter=f"{prefix}>")
        keys = set(await current_keys(self.meta))
        swept = 0
        for subject in listed.state.subjects or {}:
            name = subject[len(prefix) :]
            if name in keys or f"{name}.{HOLD}" in keys:
                continue
            try:
                await self.data.delete(name)  # its meta was written: the object goes whole
            except nats.js.errors.NotFoundError:  # no meta, or a deleted object's
                await self.data._js.purge_stream(self.data._stream, subject=subject)
            log.info("swept the chunks of upload %s, cut off", name)
            swept += 1
        return swept

    async def finish(
        self, tenant: str, file_id: str, size: int, filename: str, purpose: FilePurpose, expires_after_s: int | None
    ) -> FileObject:
        """The file object, once its bytes are whole; its hold gives way to it."""
        now = int(time.time())
        file = FileObject(
            id=file_id,
            bytes=size,
            created_at=now,
            filename=filename,
            purpose=purpose,
            status="processed",
            expires_at=now + expires_after_s if expires_after_s else None,
        )
        await self.meta.put(_key(tenant, file_id), msgspec.json.encode(file))
        await self.release(tenant, file_id)
        await self.count(tenant)
        return file

    async def discard(self, tenant: str, file_id: str) -> None:
        """An upload refused, cut off or failed: its bytes go (if they were whole), and its hold.
        Best effort, never raising over the reason it is discarded: a hold left behind lapses
        with its TTL."""
        try:
            await self.data.delete(_key(tenant, file_id))
        except nats.js.errors.ObjectNotFoundError:
            pass
        except nats.errors.Error as exc:
            log.warning("upload %s of tenant %s not discarded: %s", file_id, tenant, type(exc).__name__)
        try:
            await self.release(tenant, file_id)
        except nats.errors.Error as exc:
            log.warning("hold of upload %s of tenant %s not released: %s", file_id, tenant, type(exc).__name__)

    async def get(self, tenant: str, file_id: str) -> FileObject | None:
        """The tenant's file; None for an unknown id, another tenant's, or an expired one."""
        try:
            entry = await self.meta.get(_key(tenant, file_id))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, BadToken):
            return None
        assert entry.value is not None  # a get's entry is a stored message (a file object's JSON)
        file = _decode(entry.value)
        if file.expires_at is not None and file.expires_at <= time.time():
            await self.delete(tenant, file_id)
            return None
        return file

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        if await self.get(tenant, file_id) is None:
            return None
        buffer = io.BytesIO()  # nats-py's own `.data` grows by `+=`: quadratic in the chunks
        try:
            await self.data.get(_key(tenant, file_id), writeinto=buffer)
            return buffer.getvalue()
        except nats.js.errors.ObjectNotFoundError:
            return None

    async def delete(self, tenant: str, file_id: str) -> bool:
        """Really gone: the object's chunks are purged from the stream, the file object's key too."""
        if removed := await self._remove(tenant, file_id):
            await self.count(tenant)
        return removed

    async def _remove(self, tenant: str, file_id: str) -> bool:
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

    async def _all(self, tenant: str) -> builtins.list[FileObject]:  # `list` here is the method above
        return [_decode(value) for value in await current_values(self.meta, f"{tenant}.*")]
