"""The scheduler lease: the key `scheduler` in the `lw_sched` KV bucket, value the holder's broker id.

- Take: `kv.create` (fails while the key exists; succeeds once it expired or was deleted).
- Keep: `kv.update(..., last=revision)` every ttl/3. A wrong last sequence means another broker
  took it: step down at once. With no successful renewal for ttl - ttl/3 the holder steps down
  too, before the key (max_age = ttl, counted from the last write) can expire at the server and
  a standby take it: two schedulers never hand out the same request knowingly at once.
- Give up: delete the key (only our revision), so a standby takes it at once.
- Standbys try `create` every ttl/3, and at once when poked (a holder announced it gave up).

`LeaseClock` is the timing, with time passed in; `Lease` does the KV I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from core.tasks import wait_event
from schemas.subjects import Subjects

log = logging.getLogger("laneway.lease")

LEASE_BUCKET = "sched"
LEASE_KEY = "scheduler"


async def open_lease_bucket(
    js: JetStreamContext, s: Subjects, ttl_s: float, replicas: int = 1
) -> tuple[KeyValue, float]:
    """`lw_sched` and the lease time every broker must keep: the bucket's. It is created (history
    1, an entry lives `ttl_s` after its last write, so a dead holder's lapses) only if missing, so
    a broker configured otherwise still times its renewals by the key's real life."""
    try:
        kv = await js.key_value(s.bucket(LEASE_BUCKET))
    except nats.js.errors.BucketNotFoundError:
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket=s.bucket(LEASE_BUCKET), history=1, ttl=ttl_s, storage=StorageType.FILE, replicas=replicas
            )
        )
    bucket_ttl = (await kv.status()).ttl
    if bucket_ttl and abs(bucket_ttl - ttl_s) > 1e-3:
        log.warning("the scheduler lease lives %.1f s (the bucket's), not the configured %.1f s", bucket_ttl, ttl_s)
    return kv, bucket_ttl or ttl_s


@dataclass(slots=True)
class LeaseClock:
    ttl_s: float
    renewed_at: float | None = None  # monotonic time the last successful write was SENT; None: not held

    @property
    def every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def held(self) -> bool:
        return self.renewed_at is not None

    def wrote(self, sent_at: float) -> None:
        self.renewed_at = sent_at

    def lost(self) -> None:
        self.renewed_at = None

    def lapsed(self, now: float) -> bool:
        """Held, but no renewal landed for so long that the key may expire before the next try."""
        return self.renewed_at is not None and now - self.renewed_at >= self.ttl_s - self.every_s

    def left_s(self, now: float) -> float:
        """How long a renewal sent now may take before the holder must have stepped down."""
        return 0.0 if self.renewed_at is None else self.renewed_at + self.ttl_s - self.every_s - now


class Lease:
    def __init__(
        self,
        kv: KeyValue,
        holder: str,
        ttl_s: float,
        on_gain: Callable[[], Awaitable[None]],
        on_lose: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kv = kv
        self._holder = holder.encode()
        self._on_gain = on_gain
        self._on_lose = on_lose
        self._now = clock
        self.clock = LeaseClock(ttl_s)
        self._revision = 0
        self._wake = asyncio.Event()

    @property
    def held(self) -> bool:
        return self.clock.held

    def poke(self) -> None:
        """Try to take the lease now (its holder gave it up)."""
        self._wake.set()

    async def run(self) -> None:
        """Renew or try to take every ttl/3 (the owner steps once itself before starting this).
        A step whose take-over or step-down failed (a publish while NATS reconnects) does not end
        this task: a broker whose lease task died would never schedule again."""
        while True:
            await wait_event(self._wake, self.clock.every_s)
            self._wake.clear()
            try:
                await self.step()
            except Exception:
                log.exception("a step of the scheduler lease failed; the lease is given back and taken again")
                await self._recover()

    async def _recover(self) -> None:
        """After a failed step: a half-done take-over is stepped down, then the key given back so
        that this broker or a standby takes it afresh. If stepping down fails too, the key is
        left to lapse (a standby must not schedule beside what is left of this one)."""
        if not self.clock.held:
            return
        revision = self._revision
        try:
            await self._lose("taking over or renewing the lease failed")
        except Exception:
            log.exception("stepping down failed too: the lease lapses after %.1f s", self.clock.ttl_s)
            return
        await self._delete(revision)

    async def step(self) -> None:
        sent_at = self._now()
        if not self.clock.held:
            await self._try_take(sent_at)
        elif self.clock.lapsed(sent_at):
            await self._lose("no renewal landed within the lease's time")
        else:
            await self._renew(sent_at)

    async def _try_take(self, sent_at: float) -> None:
        try:
            self._revision = await self._kv.create(LEASE_KEY, self._holder)
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # another broker holds it
        except (TimeoutError, nats.errors.Error) as exc:
            log.debug("could not try the scheduler lease: %r", exc)
            return
        self.clock.wrote(sent_at)
        log.info("took the scheduler lease (revision %d)", self._revision)
        await self._on_gain()

    async def _renew(self, sent_at: float) -> None:
        # Bounded by the lease's own time: an answer that comes later cannot keep a holder
        # scheduling past the moment a standby may take the key (two schedulers at once).
        try:
            async with asyncio.timeout(self.clock.left_s(sent_at)):
                self._revision = await self._kv.update(LEASE_KEY, self._holder, last=self._revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            if await self._still_ours():
                self.clock.wrote(sent_at)
                return
            await self._lose("another broker holds the lease")
            return
        except (TimeoutError, nats.errors.Error) as exc:  # retried; `lapsed` bounds it
            log.warning("could not renew the scheduler lease: %r", exc)
            if self.clock.lapsed(self._now()):
                await self._lose("no renewal landed within the lease's time")
            return
        self.clock.wrote(sent_at)

    async def _still_ours(self) -> bool:
        """A renewal whose answer was lost did land: the key names us at a newer revision."""
        try:
            async with asyncio.timeout(self.clock.left_s(self._now())):
                entry = await self._kv.get(LEASE_KEY)
        except (TimeoutError, nats.errors.Error, nats.js.errors.KeyNotFoundError):
            return False
        if entry.value != self._holder or entry.revision is None:
            return False
        self._revision = entry.revision
        return True

    async def _lose(self, why: str) -> None:
        self.clock.lost()
        log.warning("stepping down as scheduler: %s", why)
        await self._on_lose(why)

    async def give_up(self) -> bool:
        """Delete the key if it is still ours, so a standby takes it at once. True if it was held."""
        if not self.clock.held:
            return False
        self.clock.lost()
        await self._delete(self._revision)
        return True

    async def _delete(self, revision: int) -> None:
        try:
            await self._kv.delete(LEASE_KEY, last=revision)
        except (TimeoutError, nats.errors.Error) as exc:  # it lapses after ttl anyway
            log.warning("could not give up the scheduler lease: %r", exc)
