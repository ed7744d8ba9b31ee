"""Runs batches: every bridge has a runner; each active batch is run by one of them at a time.

Who runs a batch is a lease in its record (`owner`, `lease_until`), taken and renewed by
compare-and-set: a bridge that dies stops renewing and another takes the batch over within a
lease. What survives is in JetStream: the record, the input file, and every finished line. The
new owner runs only the lines not finished; lines its predecessor had in flight are cancelled
(under its request ids) and run again.

Each line takes the same path as the endpoint over HTTP (`Generations.complete`): the gate's
checks, quotas, PII, routing, metering, in the `batch` class, whose lanes never delay
interactive work. A line refused for a passing reason (a full queue, a rate limit, no worker
yet, a lost worker) is tried again until the completion window ends; any other refusal is that
line's answer in the error file. Lines in flight are bounded per bridge (`concurrency`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from bridge.batch.lease import Lease, LeaseLost
from bridge.batch.run import BatchRun
from bridge.batch.store import BATCHES_BUCKET, BatchStore, decode_state
from bridge.files.store import FileStore
from bridge.generate.routes import Generations
from core.catalogue import Catalogue
from core.kvwatch import BucketWatch
from core.tasks import cancel_and_wait, pause
from schemas.batches import ACTIVE, BatchState

log = logging.getLogger("laneway.batch")

LEASE_S = 15.0
TICK_S = 1.0


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        endpoints: Mapping[str, Generations],
        catalogue: Catalogue,
        edge_id: str,
        cancel,
        *,
        concurrency: int = 64,
        lease_s: float = LEASE_S,
        klass: str = "batch",
    ) -> None:
        self.store = store
        self.files = files
        self.endpoints = endpoints
        self.catalogue = catalogue
        self.edge_id = edge_id
        self.cancel = cancel  # (tenant, request id): cancels a line in flight
        self.concurrency = concurrency
        self.lease = Lease(store, edge_id, lease_s)
        self.klass = klass
        self.slots = asyncio.Semaphore(concurrency)  # lines in flight from this bridge
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._watch: BucketWatch | None = None
        self._active: dict[str, BatchState] = {}  # key → the batch's record, while it is active

    async def start(self) -> None:
        """Watch the batches bucket (the active batches, in memory: a tick looks at those only)."""
        self._watch = BucketWatch(self.store.js, self.store.s.bucket(BATCHES_BUCKET), self._put, self._delete)
        await self._watch.start()
        self._loop_task = asyncio.create_task(self._loop(), name="batch-runner")

    def _put(self, key: str, value: bytes) -> None:
        state = decode_state(value)
        if state.batch.status in ACTIVE:
            self._active[key] = state
        else:
            self._active.pop(key, None)

    def _delete(self, key: str) -> None:
        self._active.pop(key, None)

    async def stop(self) -> None:
        """Leave every batch for another bridge at once (its lease given up), its lines kept."""
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        if self._watch is not None:
            await self._watch.stop()
        tasks = list(self._running.values())
        for task in tasks:
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        while True:
            for state in list(self._active.values()):
                self._maybe_take(state)
            await pause(TICK_S)

    def _maybe_take(self, state: BatchState) -> None:
        key = f"{state.tenant}.{state.batch.id}"
        if state.batch.status not in ACTIVE or key in self._running:
            return
        if state.owner not in ("", self.edge_id) and state.lease_until > time.time():
            return
        task = asyncio.create_task(self._run(state.tenant, state.batch.id), name=f"batch-{state.batch.id}")
        self._running[key] = task
        task.add_done_callback(lambda _t: self._running.pop(key, None))

    # -- one batch --------------------------------------------------------------------------
    async def _run(self, tenant: str, batch_id: str) -> None:
        try:
            before = await self.store.get(tenant, batch_id)
            state = await self.lease.take(tenant, batch_id)
            await BatchRun(self, state, before).go()
        except LeaseLost:
            return
        except asyncio.CancelledError:
            await self.lease.give_up(tenant, batch_id)
            raise
        except Exception:
            log.exception("batch %s stopped in this bridge; it is taken over when its lease ends", batch_id)
