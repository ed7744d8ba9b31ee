"""`laneway classes|tenants list|set` change the running system through KV: validated, applied
live by the broker (no restart), clear errors for bad input."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import nats
import pytest

from bridge.client import LanewayClient
from loadtest.stack import Stack, demo_settings
from tests.requests import chat
from tests.wait import eventually


def laneway(nats_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "laneway.cli", *args[:1], "--nats-url", nats_url, "--prefix", "ops", *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings("sk-ops"), prefix="ops") as s:
        yield s


async def test_class_change_applies_live(stack, nats_server):
    result = await asyncio.to_thread(
        laneway, nats_server.url, "classes", "set", "batch", "--max-slot-share", "0.5", "--starve-after", "12"
    )
    assert result.returncode == 0, result.stderr

    def applied() -> bool:
        policy = stack.broker.live.classes.get("batch")
        return policy is not None and policy.max_slot_share == 0.5

    assert await eventually(applied), "the class change never applied"
    policy = stack.broker.live.classes["batch"]
    assert policy.max_slot_share == 0.5 and policy.starve_after_s == 12
    listed = await asyncio.to_thread(laneway, nats_server.url, "classes", "list")
    assert '"max_slot_share":0.5' in listed.stdout.replace(" ", "")


async def test_a_class_created_live_gets_its_consumer_and_is_served(stack, nats_server):
    """Each (class, tenant) has a consumer of its own (the intake pulls a chat past a batch flood
    and past another tenant's backlog): the ones a new class and a new tenant need are made by
    `classes set` and `tenants set`, with the limits their siblings have."""
    result = await asyncio.to_thread(
        laneway,
        nats_server.url,
        "classes",
        "set",
        "vip",
        "--rank",
        "0",
        "--max-queue-wait",
        "30",
        "--max-tenant-depth",
        "64",
        "--max-slot-share",
        "1",
        "--starve-after",
        "60",
    )
    assert result.returncode == 0, result.stderr
    result = await asyncio.to_thread(
        laneway, nats_server.url, "tenants", "set", "vipco", "--classes", "vip", "--default-class", "vip"
    )
    assert result.returncode == 0, result.stderr
    assert await eventually(lambda: "vip" in stack.broker.live.classes and stack.broker.live.tenants.get("vipco"))
    nc = await nats.connect(nats_server.url)
    try:
        js, s = nc.jetstream(), stack.broker.s
        made = await js.consumer_info(s.req_stream, s.intake_durable("vip", "vipco"))
        sibling = await js.consumer_info(s.req_stream, s.intake_durable("batch", "demo"))
        assert (made.config.max_deliver, made.config.ack_wait) == (sibling.config.max_deliver, sibling.config.ack_wait)
        async with LanewayClient(nc, tenant="vipco", prefix="ops") as client:
            parts = [t async for t in client.generate(chat("hi", max_tokens=3), klass="vip")]
        assert len("".join(parts).split()) == 3
    finally:
        await nc.close()


async def test_bad_class_is_refused_and_nothing_changes(stack, nats_server):
    before = stack.broker.live.classes["interactive"]
    result = await asyncio.to_thread(
        laneway, nats_server.url, "classes", "set", "interactive", "--max-slot-share", "1.7"
    )
    assert result.returncode == 2 and "max_slot_share" in result.stderr
    assert stack.broker.live.classes["interactive"] == before


async def test_tenant_weight_change_applies_live(stack, nats_server):
    result = await asyncio.to_thread(laneway, nats_server.url, "tenants", "set", "demo", "--weight", "4")
    assert result.returncode == 0, result.stderr
    assert await eventually(lambda: stack.broker.live.tenants.weight("demo") == 4)
    bad = await asyncio.to_thread(laneway, nats_server.url, "tenants", "set", "demo", "--default-class", "vip")
    assert bad.returncode == 2 and "default_class" in bad.stderr
