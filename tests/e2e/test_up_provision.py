"""`laneway up` provisions before it starts anything, as the ops user: the settings reach KV, a
second run on the same data dir keeps an operator's live edit, and a new demo key replaces the
old one (the one overwrite `up` makes, only for the key it generated or was given)."""

from __future__ import annotations

import aiohttp
import msgspec

from core.policy import tenants as tenant_docs
from loadtest.processes import LanewayUp
from schemas.subjects import Subjects

S = Subjects("lw")


async def models_status(url: str, key: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}) as resp:
            return resp.status


async def test_up_again_keeps_live_edits_and_a_new_key_replaces_the_old(tmp_path):
    data_dir = tmp_path / "lw"
    async with LanewayUp(data_dir, "sk-first") as up:
        assert await models_status(up.url, "sk-first") == 200
        ops = await up.connect_nats("ops")
        try:
            tenants = await ops.jetstream().key_value(S.bucket("tenants"))
            demo = tenant_docs.decode("demo", (await tenants.get("demo")).value)
            await tenants.put("demo", tenant_docs.encode(msgspec.structs.replace(demo, weight=5.0)))
        finally:
            await ops.close()

    async with LanewayUp(data_dir, "sk-first") as up:  # the same key: create-if-absent
        ops = await up.connect_nats("ops")
        try:
            tenants = await ops.jetstream().key_value(S.bucket("tenants"))
            assert tenant_docs.decode("demo", (await tenants.get("demo")).value).weight == 5.0
        finally:
            await ops.close()

    async with LanewayUp(data_dir, "sk-second") as up:  # a new key: the file wins
        assert await models_status(up.url, "sk-second") == 200
        assert await models_status(up.url, "sk-first") == 401
