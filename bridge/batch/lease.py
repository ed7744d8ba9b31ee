"""A batch's lease: which bridge runs it, held in its record (`owner`, `lease_until`) and taken,
renewed and given up by compare-and-set. The runner takes it to start a run; the run renews it
while it runs (and writes its progress with it)."""

from __future__ import annotations

import asyncio
import time

import msgspec

from bridge.batch.store import BatchStore
from schemas.batches import BatchState


class LeaseLost(Exception):
    """Another bridge runs this batch now, or it is gone."""


class Lease:
    def __init__(self, store: BatchStore, owner: str, seconds: float) -> None:
        self.store = store
        self.owner = owner  # this bridge's edge id
        self.seconds = seconds

    async def take(self, tenant: str, batch_id: str, **progress) -> BatchState:
        """Take the batch's lease (free, or ours to renew) and write `progress` with it. Raises
        LeaseLost when another bridge holds it, or the batch is gone."""

        def take(state: BatchState) -> BatchState | None:
            if state.owner not in ("", self.owner) and state.lease_until > time.time():
                raise LeaseLost(batch_id)
            return msgspec.structs.replace(state, owner=self.owner, lease_until=time.time() + self.seconds, **progress)

        state = await self.store.update(tenant, batch_id, take)
        if state is None:
            raise LeaseLost(batch_id)  # deleted
        return state

    async def give_up(self, tenant: str, batch_id: str) -> None:
        def give_up(state: BatchState) -> BatchState | None:
            return msgspec.structs.replace(state, lease_until=0.0) if state.owner == self.owner else None

        try:
            await asyncio.shield(self.store.update(tenant, batch_id, give_up))
        except Exception:
            pass  # the lease ends by itself
