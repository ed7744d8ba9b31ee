"""The probe workers/orphans.py relies on, against a real nats-server: a subject someone holds a
subscription to is alive even when nobody answers; once that connection is gone, it is not."""

from __future__ import annotations

import nats
import pytest

from core.liveness import has_interest
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = pytest.mark.asyncio

S = Subjects("probe")


async def test_interest_lives_with_the_subscribing_connection_not_with_its_answers(nats_server):
    worker = await nats.connect(nats_server.url)
    bridge = await nats.connect(nats_server.url)
    try:
        assert not await has_interest(worker, S.alive("e1"))  # nobody holds it

        async def never_answers(msg) -> None:
            pass

        await bridge.subscribe(S.alive("e1"), cb=never_answers)
        await bridge.flush()
        assert await has_interest(worker, S.alive("e1"))
        assert not await has_interest(worker, S.alive("e2"))  # another bridge's

        await bridge.close()  # as a SIGKILL closes its socket (the server learns it a moment later)

        async def gone() -> bool:
            return not await has_interest(worker, S.alive("e1"))

        assert await eventually(gone, timeout=10)
    finally:
        await worker.close()
        if not bridge.is_closed:
            await bridge.close()
