"""The `lw_responses` KV bucket: one key per stored response (and conversation), `<tenant>.<id>`,
and `lw_background`, the keys of the background responses running now. The bridge creates
them (its own runtime state, as the broker does the response cache); every write carries the
tenant's retention as JetStream's per-message TTL (the stream allows it: nats-py creates KV
streams with `allow_msg_ttl`), so a tenant's retention is enforced by the server, not by a sweep.

A delete is a purge: the rollup removes every revision of the key, and the purge marker left
behind expires a second later, so nothing of the response remains in the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import Header, KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from bridge.responses.stored.budget import RecordBudget
from schemas import stored
from schemas.stored import CONVERSATION_PREFIX, RESPONSE_PREFIX, Record, StoredConversation, StoredResponse
from schemas.subjects import BACKGROUND_BUCKET, RESPONSES_BUCKET, BadToken, Subjects, stored_response_key

log = logging.getLogger("laneway.bridge")

PURGE_MARKER_TTL_S = 1  # JetStream's shortest TTL
STREAM_IN_USE = 10058  # "stream name already in use with a different configuration"
_R = TypeVar("_R", StoredResponse, StoredConversation)  # the kind of record a read decodes


class Conflict(Exception):
    """Someone wrote the key since `revision` (a cancel, while a background response ran)."""

    def __init__(self, key: str, revision: int) -> None:
        super().__init__(f"{key} changed after revision {revision}")
        self.key = key
        self.revision = revision


class ResponseStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, running: KeyValue, s: Subjects) -> None:
        self.js = js
        self.kv = kv
        self.running = running  # lw_background
        self.running_bucket = s.bucket(BACKGROUND_BUCKET)
        self._writes: set[asyncio.Task[None]] = set()  # `keep`s in flight: held, and awaited on stop
        self._prefix = f"$KV.{s.bucket(RESPONSES_BUCKET)}."
        self.budget = RecordBudget(js, f"KV_{s.bucket(RESPONSES_BUCKET)}", self._prefix)  # records per tenant

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1) -> ResponseStore:
        """History 1: an update replaces the record; no bucket TTL, every write brings its own."""
        kv = await _bucket(
            js,
            KeyValueConfig(
                bucket=s.bucket(RESPONSES_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas, direct=True
            ),
        )
        running = await _bucket(
            js,
            KeyValueConfig(
                bucket=s.bucket(BACKGROUND_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas, direct=True
            ),
        )
        return cls(js, kv, running, s)

    async def put(self, tenant: str, response_id: str, record: Record, ttl_s: int, *, after: int | None = None) -> int:
        """Write the record; `after`: only if the key is still at that revision (else `Conflict`).
        Returns the new revision."""
        key = stored_response_key(tenant, response_id)
        headers = {} if after is None else {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(after)}
        try:
            ack = await self.js.publish(self._prefix + key, stored.encode(record), headers=headers, msg_ttl=ttl_s)
        except nats.js.errors.APIError as exc:
            if after is not None and exc.err_code in (10071, 10164):  # wrong last sequence
                raise Conflict(key, after) from None
            raise
        return ack.seq

    async def get(self, tenant: str, response_id: str) -> tuple[StoredResponse, int] | None:
        """The record and its revision; None when there is none (never written, deleted, expired,
        or an id no key can have)."""
        return await self._get(tenant, response_id, StoredResponse, RESPONSE_PREFIX)

    async def get_conversation(self, tenant: str, conversation_id: str) -> tuple[StoredConversation, int] | None:
        return await self._get(tenant, conversation_id, StoredConversation, CONVERSATION_PREFIX)

    async def _get(self, tenant: str, record_id: str, kind: type[_R], prefix: str) -> tuple[_R, int] | None:
        if not record_id.startswith(prefix):  # the other kind's id, or none of ours
            return None
        try:
            entry = await self.kv.get(stored_response_key(tenant, record_id))
        except BadToken:
            return None
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        if not entry.value:
            return None
        record = stored.decode(entry.value, kind)
        assert isinstance(record, kind)  # the decoder of `kind`
        return record, entry.revision or 0

    async def delete(self, tenant: str, response_id: str) -> None:
        await self.kv.purge(stored_response_key(tenant, response_id), msg_ttl=PURGE_MARKER_TTL_S)

    async def list_running(self, tenant: str, response_id: str, listing: bytes, ttl_s: int) -> None:
        """A background response runs: listed, with its request (a `Rerun`, encoded), for every
        bridge to watch, until `unlist` or `ttl_s` (past its deadline nothing can run it again)."""
        await self.js.publish(
            f"$KV.{self.running_bucket}.{stored_response_key(tenant, response_id)}", listing, msg_ttl=ttl_s
        )

    async def listed(self, tenant: str, response_id: str) -> bytes | None:
        """The request listed with a running background response (a `Rerun`, encoded), if any."""
        try:
            entry = await self.running.get(stored_response_key(tenant, response_id))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return entry.value or None

    async def unlist(self, tenant: str, response_id: str) -> None:
        """Purged, as a delete is: its raw request gone, and no marker left behind for long."""
        await self.running.purge(stored_response_key(tenant, response_id), msg_ttl=PURGE_MARKER_TTL_S)

    def keep(self, tenant: str, response_id: str, record: StoredResponse, ttl_s: int) -> asyncio.Task[None]:
        """Store an ended response in a task of its own (`detach`): the answer awaits it before its
        last bytes, and a client gone meanwhile does not stop it. A failed write is logged (the
        answer still goes out; a later GET says 404)."""
        return self.detach(self._keep(tenant, response_id, record, ttl_s), f"keep-{response_id}")

    def detach(self, write: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a write in a task of its own, held until done and awaited when the bridge stops."""
        task = asyncio.create_task(write, name=name)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _keep(self, tenant: str, response_id: str, record: StoredResponse, ttl_s: int) -> None:
        try:
            await self.put(tenant, response_id, record, ttl_s)
        except nats.errors.Error as exc:
            log.warning("response %s not stored: %s", response_id, type(exc).__name__)

    async def drain(self) -> None:
        """Let the writes in flight finish (the bridge stopping)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


async def _bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.create_key_value(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != STREAM_IN_USE:
            raise
        return await js.key_value(config.bucket)  # an operator's changes (size, replicas) stay
