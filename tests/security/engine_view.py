"""What an engine is handed, read where an engine reads it: the batch a pull of the worker
protocol answers, taken with the worker's own NATS user, in a class no real worker of the stack
takes (so nothing else pulls it first)."""

from __future__ import annotations

import nats.errors

from loadtest.processes import LanewayUp
from schemas import codec
from schemas.work import Credit
from tests.wait import eventually


async def first_dispatched_prompt(up: LanewayUp, klass: str) -> str:
    """The first message's text of the first request the broker hands a worker of `klass`."""
    nc = await up.connect_nats("svc-worker")
    credit = codec.encode(
        Credit(
            worker_id="reader", pool="sim", free_slots=1, token_budget=10**6, total_slots=1, classes=[klass], wait_s=1.0
        )
    )
    taken = []

    async def take() -> bool:
        try:
            reply = await nc.request("lw.pull.sim", credit, timeout=5)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False  # no scheduler yet (it is taking its lease), or nothing in time
        taken.extend(codec.decode_batch(reply.data).dispatches)
        return bool(taken)

    try:
        assert await eventually(take, interval=0)
    finally:
        await nc.close()
    return taken[0].request.chat.messages[0].content
