"""The quota counters' storage: small msgpack documents in the `lw_quota_use` KV bucket, changed
only by compare-and-set. The only module of the quota stage that talks to NATS."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from core.policy.quota import BudgetDoc, RateDoc, SlotsDoc, Take
from core.tasks import pause
from schemas.subjects import Subjects

log = logging.getLogger("laneway.quota")

QUOTA_BUCKET = "quota_use"
_MONTH_S = 32 * 86400  # a counter untouched this long belongs to a month that is over
MAX_ATTEMPTS = 64
# After a lost compare-and-set a writer waits a random time up to this, doubling per loss to the
# cap: a replica that writes from its cached revision (one round trip) would otherwise win every
# race against one that must read first (two), and starve it.
BACKOFF_S, BACKOFF_CAP_S = 0.001, 0.05

_encode = msgspec.msgpack.Encoder().encode
decode_rate = msgspec.msgpack.Decoder(RateDoc).decode
decode_budget = msgspec.msgpack.Decoder(BudgetDoc).decode
decode_slots = msgspec.msgpack.Decoder(SlotsDoc).decode


class QuotaUnavailable(Exception):
    """The shared counters could not be read or written (and `fail_open` is off)."""


class QuotaContended(QuotaUnavailable):
    """The store answered, but every write lost to another writer: it is up, so this never fails
    open (that would admit past a limit exactly when the limit is being fought over)."""


async def ensure_quota_bucket(js: JetStreamContext, s: Subjects, replicas: int = 1) -> KeyValue:
    """`lw_quota_use`: history 1 (only the current count matters), entries expire after 32 days."""
    return await js.create_key_value(
        KeyValueConfig(
            bucket=s.bucket(QUOTA_BUCKET), history=1, ttl=_MONTH_S, storage=StorageType.FILE, replicas=replicas
        )
    )


class CounterStore:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.reads = self.writes = self.conflicts = 0
        self._known: dict[str, tuple[int, Any]] = {}  # key → (revision, doc) of our last write

    async def cas(self, key: str, decode: Callable[[bytes], Any], step: Callable[[Any], Take]) -> Take:
        """Apply `step` to the current document until our write lands on the revision it read
        (`kv.update(key, value, last=revision)`). Starts from the revision of our own last
        write, usually still current: an uncontended change is ONE round trip."""
        known = self._known.get(key)
        for attempt in range(MAX_ATTEMPTS):
            fresh = known is None
            if known is None:
                known = await self._read(key, decode)
            revision, doc = known
            take = step(doc)
            if take.doc is None:
                if take.denied is not None and not fresh:
                    known = None  # never refuse on a possibly stale copy
                    continue
                return take
            try:
                self.writes += 1
                new_revision = await self.kv.update(key, _encode(take.doc), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                self.conflicts += 1
                self._known.pop(key, None)
                known = None
                await pause(random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt)))
                continue
            self._known[key] = (new_revision, take.doc)
            return take
        raise QuotaContended(f"{key}: {MAX_ATTEMPTS} writes in a row lost to other writers")

    async def _read(self, key: str, decode: Callable[[bytes], Any]) -> tuple[int, Any]:
        self.reads += 1
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return 0, None
        revision = entry.revision
        assert revision is not None, "a stored KV entry has its stream sequence"
        try:
            return revision, decode(entry.value or b"")  # nats-py reads an empty value as None
        except msgspec.DecodeError:
            log.error("quota counter %s is unreadable; starting it afresh", key)
            return revision, None
