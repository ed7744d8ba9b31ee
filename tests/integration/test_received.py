"""The broker's received ids (broker/received.py) on a real nats-server: each request id once per
tenant, a redelivery and a copy of the same publish told from another publish of the id."""

from __future__ import annotations

import time
import uuid

import nats
import pytest

from broker.received import Received, Verdict
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects
from tests.requests import chat


@pytest.fixture
async def received(nats_server):
    nc = await nats.connect(nats_server.url)
    yield await Received.open(nc.jetstream(), Subjects(f"rc{uuid.uuid4().hex[:6]}"))
    await nc.close()


def request(request_id: str, tenant: str = "globex") -> GenerateRequest:
    now = time.time()
    return GenerateRequest(
        request_id=request_id,
        tenant=tenant,
        klass="batch",
        model="laneway-sim",
        reply_to=f"lw.tok.{tenant}.e",
        created_at=now,
        deadline=now + 60,
        chat=chat("hi"),
    )


async def test_an_id_is_received_once_per_tenant(received):
    r = request("order-1")
    assert await received.claim("globex", r, 10, "m1", False) is Verdict.FIRST
    assert await received.claim("globex", r, 10, "m1", False) is Verdict.FIRST  # redelivered
    assert await received.claim("globex", r, 11, "m1", False) is Verdict.COPY  # stored twice
    assert await received.claim("globex", r, 12, "m2", False) is Verdict.DUPLICATE  # published again
    assert await received.claim("globex", r, 13, None, False) is Verdict.DUPLICATE
    # Another tenant's id of the same name is its own; the first claim of it came from acme.
    assert await received.claim("acme", request("order-2", "acme"), 20, "x", False) is Verdict.FIRST
    assert await received.claim("globex", request("order-2"), 21, "x", False) is Verdict.FIRST


async def test_an_escalated_copy_is_claimed_apart_from_its_original(received):
    r = request("order-3")
    assert await received.claim("globex", r, 30, "a", False) is Verdict.FIRST
    assert await received.claim("globex", r, 31, "b", True) is Verdict.FIRST
    assert await received.claim("globex", r, 32, "c", True) is Verdict.COPY  # escalated twice
