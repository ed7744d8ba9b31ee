"""A tenant cannot take another's request ids: the dedup key is one only its tenant can occupy.

On 0ea08ee the key was the `Nats-Msg-Id` header, `<tenant>:<request_id>`, and JetStream's
duplicate window is one per stream: acme published a request of its own under
`Nats-Msg-Id: globex:order-c458e9de`, and for the next 120 s globex's own request with that id
was answered `duplicate` and never served (`LanewayClient` waited out its deadline). Now a
publish's `Nats-Msg-Id` is random and the id is deduplicated at the broker under the request
subject's tenant, which nats-server enforces (broker/received.py).
"""

from __future__ import annotations

import uuid

import msgspec
import pytest

from bridge.client import LanewayClient, LanewayError
from schemas import codec
from schemas.frames import Finished, StreamError
from schemas.subjects import MSG_ID_HEADER
from tests.requests import chat
from tests.security.publisher import S

pytestmark = pytest.mark.timeout(600)


async def test_a_tenant_cannot_suppress_anothers_request_id(up, acme):
    request_id = f"order-{uuid.uuid4().hex[:8]}"
    # acme, on its own subject with its own NATS user, claims globex's key and globex's id.
    squatter = msgspec.structs.replace(acme.request(klass="batch"), request_id=request_id)
    await acme.nc.jetstream().publish(
        S.req("batch", "acme"), codec.encode(squatter), headers={MSG_ID_HEADER: f"globex:{request_id}"}
    )
    assert isinstance(await acme.first(request_id), (Finished, StreamError))  # acme's own, ended
    globex_nc = await up.connect_nats("tenant-globex")
    try:
        async with LanewayClient(globex_nc, "globex") as globex:
            text = [
                delta
                async for delta in globex.generate(
                    chat("hello", max_tokens=3), klass="batch", timeout_s=30, request_id=request_id
                )
            ]
            assert text and globex.last_usage is not None, "globex's request was not served"
            # Its own id, sent again as a new request, is still its own: a duplicate, answered.
            with pytest.raises(LanewayError) as refused:
                async for _ in globex.generate(
                    chat("hello", max_tokens=3), klass="batch", timeout_s=30, request_id=request_id
                ):
                    pass
            assert refused.value.code == "duplicate_request", refused.value
    finally:
        await globex_nc.close()
