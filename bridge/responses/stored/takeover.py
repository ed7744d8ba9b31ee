"""Background responses whose bridge is gone, run again by another.

Every bridge watches `lw_background` (the keys of the background responses running now) and,
once a lease, reads the records of those it does not run itself. A record its writer has not
refreshed for STALE_LEASES of its leases (`lifecycle.stale`; a bridge that stops zeroes it) is
taken over by `take_over`, which claims it by compare-and-set (one bridge wins), stops the first
generation if it still runs, and publishes the request again (`Responses.take_over`). A listed
response that has ended (or is gone) is unlisted here, whoever ended it: the task that ends one
unlists it too, but one whose end another wrote (a cancel, a delete, a failure) leaves it here.
Each bridge reads each listed record it does not run once a lease: a few reads a second for
hundreds of running background responses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import nats.errors

from bridge.responses.stored.background import Background, Job
from bridge.responses.stored.lifecycle import running, stale
from core.kvwatch import BucketWatch
from core.tasks import cancel_and_wait, pause
from schemas.stored import StoredResponse

log = logging.getLogger("laneway.bridge")

# (tenant, response id, its stale record, that record's revision) → the job running it here, if any
RunAgain = Callable[[str, str, StoredResponse, int], Awaitable[Job | None]]


class Takeover:
    def __init__(self, background: Background, take_over: RunAgain) -> None:
        self.background = background
        self.store = background.store
        self._take_over = take_over
        self._listed: set[str] = set()
        self._watch: BucketWatch | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._watch = BucketWatch(
            self.store.js,
            self.store.running_bucket,
            lambda key, _v: self._listed.add(key),
            self._listed.discard,
            meta_only=True,
        )  # the requests are read when needed
        await self._watch.start()
        self._task = asyncio.create_task(self._loop(), name="background-takeover")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self._watch is not None:
            await self._watch.stop()

    async def _loop(self) -> None:
        while True:
            await pause(self.background.lease_s)
            for key in list(self._listed):
                if self.background.runs(key):
                    continue
                try:
                    await self.look_at(key)
                except nats.errors.Error as exc:
                    log.warning("background response %s not looked at: %s", key, type(exc).__name__)
                except Exception:
                    log.exception("background response %s: its takeover failed", key)

    async def look_at(self, key: str) -> None:
        tenant, _, response_id = key.partition(".")
        found = await self.store.get(tenant, response_id)
        if found is None or not running(found[0]):
            await self.store.unlist(tenant, response_id)
            return
        record, revision = found
        if stale(record, time.time()):
            job = await self._take_over(tenant, response_id, record, revision)
            if job is not None:
                self.background.run(job)
