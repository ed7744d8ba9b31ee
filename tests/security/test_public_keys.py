"""A key printed in Laneway's own files opens no tenant.

Before issue 20 `deploy/settings.toml` (and so compose) served the `demo` tenant under the hash
of `lw-demo-key-CHANGE-ME`, a key anyone can read in this repository. Now a bridge (and `laneway
up`) refuses to start with such settings, and a tenant document that holds the hash anyway (put
into KV by hand) does not let that key in.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from core.policy import tenants as tenant_docs
from core.policy.tenants import Tenant, hash_key
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_KEY = "lw-demo-key-CHANGE-ME"  # printed in deploy/settings.toml


@pytest.mark.parametrize("command", ["up", "bridge"])
async def test_the_example_settings_do_not_start(tmp_path, command):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        command,
        "--settings",
        str(ROOT / "deploy" / "settings.toml"),
        *(["--data-dir", str(tmp_path / "lw")] if command == "up" else ["--nats-url", "nats://127.0.0.1:1"]),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2, out.decode()
    assert EXAMPLE_KEY.encode() in out and b"public example" in out


async def test_a_tenant_holding_the_example_key_is_not_opened_by_it(up):
    real = "sk-leaky-" + "l" * 24
    leaky = Tenant(name="leaky", api_key_sha256=[hash_key(EXAMPLE_KEY), hash_key(real)])
    ops = await up.connect_nats("ops")
    try:
        kv = await ops.jetstream().key_value(Subjects("lw").bucket("tenants"))
        await kv.put("leaky", tenant_docs.encode(leaky))
        async with aiohttp.ClientSession(base_url=up.url) as http:

            async def models(key: str) -> int:
                async with http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}) as resp:
                    return resp.status

            async def opened() -> bool:
                return await models(real) == 200

            assert await eventually(opened)  # the bridge has the document
            assert await models(EXAMPLE_KEY) == 401
    finally:
        await kv.delete("leaky")
        await ops.close()
