"""Provisioning seeds KV from the settings file; running it again never undoes an operator's live
edit or delete. Each test has its own subject prefix, so its own buckets on the module's
nats-server; a bridge reads what KV holds."""

from __future__ import annotations

import json

import aiohttp

from bridge.app import Bridge
from bridge.config import BridgeConfig
from core.connect import NatsSettings
from core.policy import tenants as tenant_docs
from core.policy.tenants import Tenant, hash_key
from core.provision import provision_at
from core.settings import LogicalModel, Settings
from core.topology import StreamLimits

SETTINGS = Settings(
    tenants={
        "acme": Tenant(name="acme", api_key_sha256=[hash_key("sk-acme")]),
        "zeta": Tenant(name="zeta", api_key_sha256=[hash_key("sk-zeta")]),
    },
    models={"laneway-sim": LogicalModel(pool="sim")},
)
LIVE_ACME = Tenant(name="acme", api_key_sha256=[hash_key("sk-acme"), hash_key("sk-acme-live")], weight=3.0)


def bridge(nats_server, prefix: str) -> Bridge:
    return Bridge(BridgeConfig(nats=NatsSettings(url=nats_server.url, prefix=prefix), port=0), SETTINGS)


async def provision(nats_server, prefix: str, settings: Settings = SETTINGS, *, overwrite: bool = False) -> None:
    await provision_at(NatsSettings(url=nats_server.url, prefix=prefix), StreamLimits(), settings, overwrite=overwrite)


async def status_with(b: Bridge, key: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{b.url}/v1/models", headers={"Authorization": f"Bearer {key}"}) as resp:
            return resp.status


async def tenants_kv(b: Bridge):
    return await b._nc.jetstream().key_value(b.s.bucket("tenants"))


async def edit_live(b: Bridge) -> None:
    """What an operator does with `laneway tenants set` and a delete: acme gets a second key and
    weight 3, zeta is removed."""
    tenants = await tenants_kv(b)
    await tenants.put("acme", tenant_docs.encode(LIVE_ACME))
    await tenants.delete("zeta")


async def test_provisioning_again_keeps_live_edits_and_deletes(nats_server, caplog):
    await provision(nats_server, "keep")
    async with bridge(nats_server, "keep") as first:
        assert await status_with(first, "sk-acme") == 200  # seeded from the settings file
        await edit_live(first)
    with caplog.at_level("INFO", logger="laneway.provision"):
        await provision(nats_server, "keep")  # the same settings file
        async with bridge(nats_server, "keep") as restarted:
            assert await status_with(restarted, "sk-acme-live") == 200
            assert await status_with(restarted, "sk-zeta") == 401
            assert json.loads((await (await tenants_kv(restarted)).get("acme")).value)["weight"] == 3.0
    kept = [r.getMessage() for r in caplog.records if "kept" in r.getMessage()]
    assert kept and "tenants/acme" in kept[0] and "tenants/zeta" in kept[0]


async def test_a_tenant_new_to_the_settings_file_is_created(nats_server):
    await provision(nats_server, "grow")
    grown = Settings(
        tenants={**SETTINGS.tenants, "newco": Tenant(name="newco", api_key_sha256=[hash_key("sk-newco")])},
        models=SETTINGS.models,
    )
    await provision(nats_server, "grow", grown)
    async with bridge(nats_server, "grow") as b:
        assert await status_with(b, "sk-newco") == 200


async def test_settings_overwrite_is_an_explicit_choice(nats_server):
    await provision(nats_server, "over")
    async with bridge(nats_server, "over") as first:
        await edit_live(first)
    await provision(nats_server, "over", overwrite=True)
    async with bridge(nats_server, "over") as b:
        assert await status_with(b, "sk-acme-live") == 401  # the settings file won
        assert await status_with(b, "sk-zeta") == 200
