"""Where batches live: their records in a KV bucket (`lw_batches`, `<tenant>.<batch_id>`), their
finished lines in a stream (`LW_BATCH`, one subject per batch) until the batch is finalized into
its output and error files. Both are JetStream's, so a batch survives a restart of every Laneway
process, encrypted at rest with the rest.

A record changes by compare-and-set on its revision (`update`): the API (a cancel) and the
runner (progress, its lease) write the same record from different bridges, and neither may undo
the other's change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.kv import KeyValue

from core.kvwatch import current_values
from schemas import codec
from schemas.batches import BatchState, LineResult
from schemas.subjects import MSG_ID_HEADER, BadToken, Subjects, tenant_key
from schemas.usage import Superseded

BATCHES_BUCKET = "batches"
DUPLICATE_WINDOW_S = 120.0
decode_state = msgspec.json.Decoder(BatchState).decode
_decode_line = msgspec.msgpack.Decoder(LineResult).decode
_encode = msgspec.msgpack.Encoder().encode


def batch_key(tenant: str, batch_id: str) -> str:
    return tenant_key(tenant, "batch id", batch_id)


class BatchStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, s: Subjects) -> None:
        self.js = js
        self.kv = kv
        self.s = s

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1) -> BatchStore:
        kv = await js.create_key_value(
            KeyValueConfig(bucket=s.bucket(BATCHES_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas)
        )
        config = StreamConfig(
            name=s.batch_stream,
            subjects=[s.batch_done_all],
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != 10058:  # it exists, made by another bridge: use it as it is
                raise
        return cls(js, kv, s)

    async def supersede(self, superseded: Superseded) -> None:
        """Say on the tenant's usage subject (`LW_USAGE`) which run of a line run again is billed."""
        await self.js.publish(self.s.usage(superseded.tenant), codec.encode(superseded))

    # -- records --------------------------------------------------------------------------
    async def create(self, state: BatchState) -> None:
        await self.kv.create(batch_key(state.tenant, state.batch.id), msgspec.json.encode(state))

    async def get(self, tenant: str, batch_id: str) -> BatchState | None:
        try:
            found = await self._get(batch_key(tenant, batch_id))
        except BadToken:  # not an id Laneway gave out
            return None
        return found[0] if found else None

    async def _get(self, key: str) -> tuple[BatchState, int] | None:
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        assert entry.value is not None and entry.revision is not None  # a get's entry is a stored message
        return decode_state(entry.value), entry.revision

    async def update(
        self, tenant: str, batch_id: str, change: Callable[[BatchState], BatchState | None]
    ) -> BatchState | None:
        """Apply `change` to the stored record until it lands on the revision it read. `change`
        returns None to leave the record as it is (that record is returned)."""
        try:
            key = batch_key(tenant, batch_id)
        except BadToken:
            return None
        while True:
            found = await self._get(key)
            if found is None:
                return None
            state, revision = found
            new = change(state)
            if new is None:
                return state
            try:
                await self.kv.update(key, msgspec.json.encode(new), last=revision)
                return new
            except nats.js.errors.KeyWrongLastSequenceError:
                await asyncio.sleep(0)  # another writer went first: read theirs, change again

    async def _watch(self, keys: str) -> list[BatchState]:  # above `list`, which hides the builtin below it
        return [decode_state(value) for value in await current_values(self.kv, keys)]

    async def list(self, tenant: str) -> list[BatchState]:
        """The tenant's batches, oldest first."""
        return sorted(await self._watch(f"{tenant}.*"), key=lambda b: (b.batch.created_at, b.batch.id))

    # -- finished lines ---------------------------------------------------------------------
    async def record_line(self, tenant: str, batch_id: str, result: LineResult) -> None:
        """Kept once per line: a line finished twice (a takeover's race) within the window is
        stored once, and `done_lines` keeps the first of any later copy."""
        await self.js.publish(
            self.s.batch_done(tenant, batch_id), _encode(result), headers={MSG_ID_HEADER: f"{batch_id}:{result.line}"}
        )

    async def done_lines(self, tenant: str, batch_id: str) -> dict[int, LineResult]:
        subject = self.s.batch_done(tenant, batch_id)
        info = await self.js.stream_info(self.s.batch_stream, subjects_filter=subject)
        stored = (info.state.subjects or {}).get(subject, 0)
        done: dict[int, LineResult] = {}
        if not stored:
            return done
        sub = await self.js.subscribe(subject, stream=self.s.batch_stream, ordered_consumer=True)
        try:
            for _ in range(stored):
                msg = await sub.next_msg(timeout=30)
                result = _decode_line(msg.data)
                done.setdefault(result.line, result)
        finally:
            await sub.unsubscribe()
        return done

    async def forget_lines(self, tenant: str, batch_id: str) -> None:
        """Once the batch's files hold them."""
        await self.js.purge_stream(self.s.batch_stream, subject=self.s.batch_done(tenant, batch_id))
