"""Rule sets, versioned in the `lw_routing` KV bucket.

- `rules` holds the current rule set; every process watches it (core/kvwatch.BucketWatch) and
  applies a new value live. Writes are compare-and-set on its KV revision, so two admins cannot
  overwrite each other (optimistic concurrency on the version number they last read).
- `rules.v<N>` holds version N, written once and never changed: rollback to any version keeps
  working after the bucket's own history (16 revisions per key) has rolled over.
- A rollback is a new version whose rules are an old version's, marked `rollback_of`: history
  only ever grows, so an audit can replay every state the router was in.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgspec
import nats
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from core.connect import NatsSettings, connect_once
from core.kvwatch import current_entries
from core.routing.rules import RuleSet, decode, encode, validate
from schemas.subjects import Subjects

RULES_KEY = "rules"
_VERSION_KEY = re.compile(r"^rules\.v(\d+)$")
ROUTING_HISTORY = 16  # as core/topology.py creates the bucket


def version_key(version: int) -> str:
    return f"rules.v{version}"


def is_rules_key(key: str) -> bool:
    """The key a watcher applies; `rules.v<N>` keys are the archive and must be ignored."""
    return key == RULES_KEY


class VersionConflict(Exception):
    """The rule set changed since the caller read it (another admin got there first)."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"expected version {expected}, but the current version is {actual}")
        self.expected = expected
        self.actual = actual


class VersionNotFound(LookupError):
    def __init__(self, version: int) -> None:
        super().__init__(f"rule set version {version} does not exist")
        self.version = version


class RuleStore:
    def __init__(self, kv: KeyValue, clock: Callable[[], float] = time.time) -> None:
        self._kv = kv
        self._clock = clock

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects) -> RuleStore:
        """The bucket exists once provisioning ran; create it for a bare NATS too."""
        try:
            kv = await js.key_value(s.bucket("routing"))
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(
                KeyValueConfig(bucket=s.bucket("routing"), history=ROUTING_HISTORY, storage=StorageType.FILE)
            )
        return cls(kv)

    # -- reads ------------------------------------------------------------------------------
    async def _current(self) -> tuple[RuleSet | None, int]:
        """(current rule set or None, the KV revision to compare-and-set against)."""
        try:
            entry = await self._kv.get(RULES_KEY)
        except nats.js.errors.KeyDeletedError as exc:
            return None, exc.entry.revision if exc.entry else 0
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        return decode(entry.value or b""), entry.revision or 0

    async def get_current(self) -> RuleSet | None:
        return (await self._current())[0]

    async def get_version(self, version: int) -> RuleSet:
        try:
            entry = await self._kv.get(version_key(version))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            current = await self.get_current()
            if current is not None and current.version == version:
                await self._archive(current)  # a writer died between its two writes
                return current
            raise VersionNotFound(version) from None
        return decode(entry.value or b"")

    async def history(self) -> list[RuleSet]:
        """Every version, oldest first."""
        found: dict[int, RuleSet] = {}
        for entry in await current_entries(self._kv, "rules.*"):
            if m := _VERSION_KEY.match(entry.key):
                found[int(m.group(1))] = decode(entry.value or b"")
        current = await self.get_current()
        if current is not None and current.version not in found:
            await self._archive(current)
            found[current.version] = current
        return [found[v] for v in sorted(found)]

    # -- writes -----------------------------------------------------------------------------
    async def put(self, ruleset: RuleSet, expected_version: int) -> RuleSet:
        """Store `ruleset` as the next version if the current one is still `expected_version`
        (0 when there is none yet). Returns what was stored, version and created_at filled in."""
        current, revision = await self._current()
        actual = current.version if current else 0
        if expected_version != actual:
            raise VersionConflict(expected_version, actual)
        if current is not None:
            await self._archive(current)
            number = actual + 1
        else:
            # First rule set, or `rules` was deleted by hand: never reuse an archived number.
            number = max((r.version for r in await self.history()), default=0) + 1
        stored = validate(msgspec.structs.replace(ruleset, version=number, created_at=self._clock()))
        document = encode(stored)
        try:
            if revision:
                await self._kv.update(RULES_KEY, document, last=revision)
            else:
                await self._kv.create(RULES_KEY, document)
        except nats.js.errors.KeyWrongLastSequenceError:
            now = await self.get_current()
            raise VersionConflict(expected_version, now.version if now else 0) from None
        await self._archive(stored)
        return stored

    async def rollback(
        self, version: int, author: str, reason: str = "", expected_version: int | None = None
    ) -> RuleSet:
        """Make version `version`'s rules current again, as a new version."""
        old = await self.get_version(version)
        if expected_version is None:
            current = await self.get_current()
            expected_version = current.version if current else 0
        restored = msgspec.structs.replace(
            old, author=author, reason=reason or f"rollback to version {version}", rollback_of=version, gate=None
        )
        return await self.put(restored, expected_version)

    async def _archive(self, ruleset: RuleSet) -> None:
        """Write `rules.v<N>` once. Only the compare-and-set winner for N reaches here with a new
        N, so `create` losing means the same document is already archived."""
        try:
            await self._kv.create(version_key(ruleset.version), encode(ruleset))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass


@asynccontextmanager
async def connect_store(
    url: str, prefix: str, user: str | None = None, password: str | None = None
) -> AsyncIterator[RuleStore]:
    """A one-shot connection for command-line tools: fail fast instead of reconnecting forever."""
    nc = await connect_once(NatsSettings(url=url, prefix=prefix, user=user, password=password), "laneway-routing")
    try:
        yield await RuleStore.open(nc.jetstream(), Subjects(prefix))
    finally:
        await nc.close()
