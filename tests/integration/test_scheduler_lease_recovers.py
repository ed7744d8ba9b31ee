"""The scheduler lease outlives a failed take-over, against a real nats-server's KV: the half-done
take-over is stepped down, the key given back, and the lease taken again on the next tick. Before,
the exception ended the lease's task: the broker never scheduled again, and the key it held kept
a standby out until it lapsed."""

from __future__ import annotations

import asyncio

import nats
import nats.errors

from broker.scheduler.lease import LEASE_KEY, Lease, open_lease_bucket
from core.tasks import cancel_and_wait
from schemas.subjects import Subjects
from tests.wait import eventually

TTL_S = 1.5


async def test_a_failed_take_over_is_stepped_down_given_back_and_taken_again(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv, ttl = await open_lease_bucket(nc.jetstream(), Subjects("lease-recovers"), TTL_S)
        calls: list[str] = []
        revisions: list[int] = []

        async def on_gain() -> None:
            calls.append("gain")
            revisions.append((await kv.get(LEASE_KEY)).revision or 0)
            if calls.count("gain") == 1:  # as a publish fails while NATS reconnects
                raise nats.errors.OutboundBufferLimitError

        async def on_lose(why: str) -> None:
            calls.append(f"lose: {why}")

        lease = Lease(kv, "broker-a", ttl, on_gain, on_lose)
        task = asyncio.create_task(lease.run())
        try:
            assert await eventually(lambda: calls.count("gain") == 2 and lease.held, timeout=30), calls
        finally:
            await cancel_and_wait(task)
        assert calls == ["gain", "lose: taking over or renewing the lease failed", "gain"]
        # Given back (a delete), not left to lapse: taken again at a later revision of the key.
        assert revisions[1] > revisions[0]
        assert (await kv.get(LEASE_KEY)).value == b"broker-a"
    finally:
        await nc.close()
