"""The broker holds a direct publisher to its tenant's classes: the subject's class token is the
publisher's choice, so the gate checks it against the tenant document in `lw_tenants`, not only
the bridge."""

from __future__ import annotations

import nats
import pytest

from bridge.client import LanewayClient, LanewayError
from core.policy.tenants import Tenant, hash_key
from core.settings import LogicalModel, Settings
from loadtest.stack import Stack
from tests.integration.test_poison_and_overload import stored_is
from tests.requests import chat
from tests.wait import eventually


def settings() -> Settings:
    nightly = Tenant(name="nightly", api_key_sha256=[hash_key("sk-nightly")], default_class="batch", classes=["batch"])
    return Settings(tenants={"nightly": nightly}, models={"laneway-sim": LogicalModel(pool="sim")})


async def test_a_class_the_tenant_may_not_use_is_refused_and_never_generated(nats_server):
    async with Stack(nats_server.url, settings(), prefix="cls") as stack:
        assert await eventually(lambda: stack.broker.live.tenants.get("nightly") is not None)
        nc = await nats.connect(nats_server.url)
        try:
            async with LanewayClient(nc, "nightly", prefix="cls") as client:
                with pytest.raises(LanewayError) as err:
                    async for _ in client.generate(
                        chat("let me jump the queue", max_tokens=256), klass="interactive", timeout_s=60
                    ):
                        pass
                assert err.value.code == "class_not_allowed"
                assert "'interactive'" in err.value.message and "batch" in err.value.message
                # Terminated, not left to be redelivered.
                assert await eventually(lambda: stored_is(nc, "CLS_REQ", 0))
                # Its own class is served; the engine saw that request only.
                parts = [
                    t async for t in client.generate(chat("overnight job", max_tokens=2), klass="batch", timeout_s=60)
                ]
                assert len("".join(parts).split()) == 2
                assert stack.finished() == 1
        finally:
            await nc.close()


@pytest.mark.parametrize(
    "extra, field",
    [
        (b'{"priority": -100}', "priority"),  # Laneway's class decides the engine priority
        (b'{"cache_salt": "guess"}', "cache_salt"),  # and the tenant scope the prefix-cache salt
        (b'{"messages": []}', "messages"),  # would override what the gate checked
        (b"[1, 2]", "extra"),
    ],
)
async def test_a_direct_publishers_extra_cannot_set_what_laneway_owns(nats_server, extra, field):
    async with Stack(nats_server.url, settings(), prefix=f"own{field.replace('_', '')}") as stack:
        nc = await nats.connect(nats_server.url)
        try:
            async with LanewayClient(nc, "nightly", prefix=stack.prefix) as client:
                with pytest.raises(LanewayError) as err:
                    async for _ in client.generate(
                        chat("hello", max_tokens=2), klass="batch", timeout_s=60, extra=extra
                    ):
                        pass
                assert err.value.code == "invalid_request" and field in err.value.message
                assert stack.finished() == 0
        finally:
            await nc.close()
