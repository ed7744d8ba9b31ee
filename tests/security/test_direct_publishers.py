"""A tenant publishes straight to the subjects with its generated NATS user, past the bridge.

Before issue 20 the broker trusted what such a publisher wrote: `escalated: true` was admitted
with force (no quota, no budget), a request stored under any `Nats-Msg-Id` was served (that key is
now a random one per publish: the broker receives an id once per tenant, test_tenant_keys.py), a tenant
whose document the operator had deleted was served with no class, PII or quota check, and a
cancel acted on the tenant its payload named. Each is refused now, with the refusal on the
publisher's own inbox.
"""

from __future__ import annotations

import pytest

from schemas import codec
from schemas.frames import Delta, Finished, StreamError
from schemas.requests import Cancel
from tests.security.publisher import Publisher, S

pytestmark = pytest.mark.timeout(600)


async def test_a_tenant_cannot_mark_its_request_escalated(acme):
    request = acme.request(escalated=True)
    await acme.publish(request)
    end = await acme.first(request.request_id)
    assert isinstance(end, StreamError), end
    assert end.code == "invalid_request" and end.param == "escalated", end


async def test_a_request_id_is_received_once_per_tenant(acme):
    """A `Nats-Msg-Id` is the publisher's own business now (broker/received.py): a request under
    any key is served once, and another publish of its id is refused, on the publisher's inbox."""
    request = acme.request()
    await acme.publish(request, stored_as=f"globex:{request.request_id}")
    assert isinstance(await acme.first(request.request_id), Finished)
    await acme.publish(request)  # a new publish (another Nats-Msg-Id) of the same id
    end = await acme.first(request.request_id)
    assert isinstance(end, StreamError) and end.code == "duplicate_request", end
    assert end.param == "request_id", end


async def test_a_cancel_acts_on_its_subjects_tenant_not_its_payloads(up, acme):
    globex_nc = await up.connect_nats("tenant-globex")
    try:
        globex = await Publisher(globex_nc, "globex").start()
        victim = globex.request(max_tokens=200)
        await globex.publish(victim)
        assert isinstance(await globex.next(victim.request_id), Delta)  # running
        # acme may publish only on its own cancel subjects, and names globex in the payload.
        await acme.nc.publish(
            S.cancel("acme", victim.request_id), codec.encode(Cancel(request_id=victim.request_id, tenant="globex"))
        )
        await acme.nc.flush()
        end = await globex.first(victim.request_id)
        assert isinstance(end, Finished), f"globex's request was ended by acme's cancel: {end}"
        assert end.usage.completion_tokens == 200
    finally:
        await globex_nc.close()


async def test_a_tenant_the_operator_removed_is_refused(up):
    ops = await up.connect_nats("ops")
    globex_nc = await up.connect_nats("tenant-globex")
    tenants = await ops.jetstream().key_value(S.bucket("tenants"))
    document = (await tenants.get("globex")).value
    try:
        await tenants.delete("globex")  # its NATS user lives on until the next restart
        globex = await Publisher(globex_nc, "globex").start()
        # The brokers see the deletion through their watch: ask until one refuses.
        for _ in range(100):
            request = globex.request()
            await globex.publish(request)
            end = await globex.first(request.request_id)
            if isinstance(end, StreamError):
                break
        assert isinstance(end, StreamError) and end.code == "unknown_tenant", end
    finally:
        await tenants.put("globex", document)
        await globex_nc.close()
        await ops.close()
