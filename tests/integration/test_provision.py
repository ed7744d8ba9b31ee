"""Provisioning is its own step: `laneway ops provision` makes the streams, the class consumers,
the live buckets and the settings file's documents, and a second run leaves an operator's live
edit alone; a broker and a bridge started before it wait for it, then serve."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from dataclasses import replace

import aiohttp
import nats
import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from bridge.app import Bridge
from bridge.config import BridgeConfig
from broker.app import Broker
from broker.config import BrokerConfig
from core.connect import NatsSettings
from core.models import MODELS_KEY
from core.natsd import NatsServer
from core.policy import tenants as tenant_docs
from core.policy.classes import DEFAULT_CLASSES
from core.policy.tenants import Tenant, hash_key
from core.provision import provision_at
from core.topology import StreamLimits, ensure_intake, ensure_topology, request_stream
from loadtest.stack import demo_settings
from schemas.subjects import Subjects
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import Worker, WorkerConfig

KEY = "sk-provision"
SETTINGS_TOML = f"""
[tenants.acme]
api_key_sha256 = ["{hash_key(KEY)}"]
default_class = "standard"

[models."laneway-sim"]
pool = "sim"
"""
BODY = {"model": "laneway-sim", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.timeout(180)


def laneway(nats_url: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "laneway.cli", *argv, "--nats-url", nats_url],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_ops_provision_creates_everything_and_a_rerun_keeps_a_live_edit(nats_server, tmp_path):
    settings = tmp_path / "settings.toml"
    settings.write_text(SETTINGS_TOML)
    s = Subjects("prov")
    first = await asyncio.to_thread(
        laneway,
        nats_server.url,
        "ops",
        "provision",
        "--prefix",
        "prov",
        "--settings",
        str(settings),
        "--max-deliver",
        "7",
    )
    assert first.returncode == 0, first.stderr
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        for stream in (s.req_stream, s.usage_stream, s.dlq_stream, s.audit_stream):
            assert (await js.stream_info(stream)).config.name == stream
        for policy in DEFAULT_CLASSES:  # one consumer per (class, tenant), none wider
            info = await js.consumer_info(s.req_stream, s.intake_durable(policy.name, "acme"))
            assert (info.config.max_deliver, info.config.filter_subjects) == (7, s.intake_filters(policy.name, "acme"))
        assert sorted(c.name for c in await js.consumers_info(s.req_stream)) == sorted(
            s.intake_durable(c.name, "acme") for c in DEFAULT_CLASSES
        )
        assert (await js.stream_info(s.req_stream)).config.subjects == s.req_stream_subjects(["acme"])
        classes = await js.key_value(s.bucket("classes"))
        assert sorted(await classes.keys()) == sorted(c.name for c in DEFAULT_CLASSES)
        routing = await js.key_value(s.bucket("routing"))
        assert "laneway-sim" in json.loads((await routing.get(MODELS_KEY)).value)
        tenants = await js.key_value(s.bucket("tenants"))
        assert tenant_docs.decode("acme", (await tenants.get("acme")).value).api_key_sha256 == [hash_key(KEY)]

        # An operator's live edit (`laneway tenants set acme --weight 3`), then provisioning again.
        await tenants.put("acme", tenant_docs.encode(Tenant(name="acme", api_key_sha256=[hash_key(KEY)], weight=3.0)))
        again = await asyncio.to_thread(
            laneway,
            nats_server.url,
            "ops",
            "provision",
            "--prefix",
            "prov",
            "--settings",
            str(settings),
            "--max-deliver",
            "7",
        )
        assert again.returncode == 0, again.stderr
        assert "kept KV's own tenants/acme" in again.stderr
        assert tenant_docs.decode("acme", (await tenants.get("acme")).value).weight == 3.0
    finally:
        await nc.close()


async def test_ops_provision_reports_a_bad_settings_file(nats_server, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[tenants.acme]\nweight = 'heavy'\n")
    result = await asyncio.to_thread(
        laneway, nats_server.url, "ops", "provision", "--prefix", "bad", "--settings", str(bad)
    )
    assert result.returncode == 2 and "bad.toml" in result.stderr


async def test_a_stream_larger_than_jetstreams_storage_is_refused_with_the_flag_to_lower(tmp_path):
    """JetStream reserves the request stream's max_bytes when it is made: on a server with less
    file storage than that, provisioning says so (and which flag lowers it) instead of a 500."""
    async with NatsServer(tmp_path / "nats", max_file_store=1024**3) as small:
        refused = await asyncio.to_thread(laneway, small.url, "ops", "provision", "--prefix", "small")
        assert refused.returncode == 1
        assert "could not reserve max_bytes=4.00 GiB" in refused.stderr and "--max-stream-gib" in refused.stderr
        whole = await asyncio.to_thread(
            laneway, small.url, "ops", "provision", "--prefix", "whole", "--max-stream-gib", "1"
        )  # the next stream finds none left
        assert whole.returncode == 1 and "no file storage was left for it" in whole.stderr, whole.stderr
        nc = await nats.connect(small.url)
        try:
            js = nc.jetstream()
            await js.delete_stream(Subjects("whole").req_stream)  # its reservation back
            fits = await asyncio.to_thread(
                laneway, small.url, "ops", "provision", "--prefix", "small", "--max-stream-gib", "0.5"
            )
            assert fits.returncode == 0, fits.stderr
            info = await js.stream_info(Subjects("small").req_stream)
        finally:
            await nc.close()
        assert info.config.max_bytes == 512 * 1024**2


async def test_services_started_before_provisioning_wait_for_it_then_serve(nats_server, caplog):
    n = NatsSettings(url=nats_server.url, prefix="early")
    settings = demo_settings(KEY)
    broker = Broker(BrokerConfig(nats=n, pii="off"))
    bridge = Bridge(BridgeConfig(nats=n, port=0), settings)
    worker = Worker(WorkerConfig(nats=n, pool="sim"), SimEngine(PROFILES["zero"]))
    services = {"broker": broker, "bridge": bridge, "worker": worker}

    def waiting(who: str) -> bool:
        return any(r.getMessage().startswith(f"{who}: waiting for provisioning") for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="laneway.provision"):
        starts = [asyncio.create_task(c.start()) for c in services.values()]
        try:
            assert await eventually(lambda: all(waiting(who) for who in services))
            assert "run `laneway ops provision`" in caplog.text and not any(t.done() for t in starts)
            await provision_at(n, StreamLimits(), settings)
            await asyncio.wait_for(asyncio.gather(*starts), 30)
            await bridge.wait_ready()
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    f"{bridge.url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"}
                ) as resp:
                    assert resp.status == 200, await resp.text()
        finally:
            for task in starts:
                task.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            for service in (worker, bridge, broker):
                await service.stop()


@pytest.mark.parametrize("legacy", ["whole-stream", "per-class"])
async def test_an_install_from_before_tenant_consumers_loses_nothing_it_stored(nats_server, legacy):
    """Its consumers (one on the whole request stream, or later one per class) would overlap the
    (class, tenant) ones (a work queue's may not): provisioning deletes them, and what they
    stored, delivered and not, is pulled by the new consumers."""
    s = Subjects(f"legacy{legacy[:3]}")
    classes = ("interactive", "batch")
    old_names = {
        "whole-stream": {f"{s.prefix}-broker": [s.req("*", "*"), s.req_escalated("*", "*")]},
        "per-class": {f"{s.prefix}-req-{k}": [s.req(k, "*"), s.req_escalated(k, "*")] for k in classes},
    }[legacy]
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            replace(request_stream(s, StreamLimits(), []), subjects=[s.req("*", "*"), s.req_escalated("*", "*")])
        )
        for name, filters in old_names.items():
            await js.add_consumer(
                s.req_stream,
                ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT, ack_wait=600, filter_subjects=filters),
            )
        for klass in classes:
            await js.publish(s.req(klass, "acme"), klass.encode())
        first = next(iter(old_names))
        old = await js.pull_subscribe_bind(first, s.req_stream)
        assert [m.data for m in await old.fetch(1, timeout=10)] == [b"interactive"]  # never acked
        await old.unsubscribe()

        await ensure_topology(js, s, StreamLimits())
        await ensure_intake(js, s, StreamLimits(), tenants=["acme"])
        names = {c.name for c in await js.consumers_info(s.req_stream)}
        assert not names & set(old_names) and s.intake_durable("interactive", "acme") in names
        for klass in classes:
            pull = await js.pull_subscribe_bind(s.intake_durable(klass, "acme"), s.req_stream)
            assert [m.data for m in await pull.fetch(1, timeout=10)] == [klass.encode()]
    finally:
        await nc.close()


async def test_a_request_for_a_tenant_with_no_document_is_refused_at_publish(nats_server):
    """No consumer would ever pull it: the request stream does not take it, and the publisher
    is told at once rather than left waiting."""
    s = Subjects("nodoc")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js, s, StreamLimits())
        await ensure_intake(js, s, StreamLimits(), tenants=["acme"])
        await js.publish(s.req("interactive", "acme"), b"{}")
        with pytest.raises(nats.js.errors.NoStreamResponseError):
            await js.publish(s.req("interactive", "stranger"), b"{}")
    finally:
        await nc.close()
