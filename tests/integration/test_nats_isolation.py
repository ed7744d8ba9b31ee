"""Tenant isolation on NATS itself: with `laneway nats-config`'s users, tenant A cannot read B's
tokens or publish requests as B, while the services run the whole data path with their roles."""

from __future__ import annotations

import asyncio

import nats
import pytest

from broker.client import LanewayClient
from laneway.nats_config import generate_passwords, render
from laneway.natsd import NatsServer
from laneway.stack import Stack, demo_settings
from schemas.requests import ChatMessage, SamplingParams
from schemas.subjects import Subjects


@pytest.fixture(scope="module")
async def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    passwords = generate_passwords(["alpha", "beta"])
    config = root / "nats.conf"
    config.write_text(render(Subjects("lw"), ["alpha", "beta"], passwords))
    server = NatsServer(root / "store", config_file=config)
    await server.start()
    yield server, passwords
    await server.stop()


async def tenant_conn(server, passwords, tenant: str, errors: list):
    async def on_error(exc):
        errors.append(str(exc))
    return await nats.connect(server.url, user=f"tenant-{tenant}", password=passwords[f"tenant-{tenant}"],
                              inbox_prefix=f"_INBOX_{tenant}", error_cb=on_error)


async def test_services_run_the_data_path_and_tenants_stay_in_their_lane(secured):
    server, passwords = secured
    creds = {role: (f"svc-{role}", passwords[f"svc-{role}"]) for role in ("broker", "worker", "bridge")}
    settings = demo_settings("sk-a", tenant="alpha", extra_tenants={"beta": "sk-b"})
    async with Stack(server.url, settings, credentials=creds):
        errors_a: list[str] = []
        alpha = await tenant_conn(server, passwords, "alpha", errors_a)
        beta = await tenant_conn(server, passwords, "beta", [])
        try:
            # A works as itself, end to end, with its own inbox prefix for PubAcks.
            async with LanewayClient(alpha, "alpha") as client:
                text = "".join([t async for t in client.generate(
                    model="laneway-sim", messages=[ChatMessage("user", "hi")],
                    sampling=SamplingParams(max_tokens=3))])
                assert len(text.split()) == 3

            # A tries to read B's token frames: the server refuses the subscription.
            stolen: list = []

            async def steal(msg):
                stolen.append(msg)
            await alpha.subscribe("lw.tok.beta.>", cb=steal)
            await alpha.flush()
            async with LanewayClient(beta, "beta") as client:
                assert [t async for t in client.generate(
                    model="laneway-sim", messages=[ChatMessage("user", "secret")],
                    sampling=SamplingParams(max_tokens=2))]
            await asyncio.sleep(0.2)
            assert stolen == []
            assert any("permissions violation" in e.lower() and "lw.tok.beta" in e for e in errors_a)

            # A tries to publish a request as B: refused, nothing stored.
            js = alpha.jetstream()
            with pytest.raises(Exception):
                await js.publish("lw.req.interactive.beta", b"x", timeout=1)
            await alpha.publish("lw.req.interactive.beta", b"x")
            await alpha.flush()
            await asyncio.sleep(0.2)
            assert any("lw.req.interactive.beta" in e for e in errors_a)
        finally:
            await alpha.close()
            await beta.close()
