"""Attacks on Laneway's trust boundaries, made where users meet them: against `laneway up`, with
the NATS accounts and users it generates. Two tenants, as an operator would set them up: acme may
use every class, globex only batch. Each attack here failed on the main it was written against
(see each module's docstring) and must be refused now, with nothing written and nothing charged."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from loadtest.processes import LanewayUp
from tests.security.publisher import Publisher

KEYS = {"acme": "sk-acme-" + "a" * 24, "globex": "sk-globex-" + "g" * 24}

SETTINGS = f"""
[tenants.acme]
api_key_sha256 = ["{hashlib.sha256(KEYS["acme"].encode()).hexdigest()}"]
classes = ["interactive", "standard", "batch"]

[tenants.globex]
api_key_sha256 = ["{hashlib.sha256(KEYS["globex"].encode()).hexdigest()}"]
default_class = "batch"
classes = ["batch"]

[models.laneway-sim]
pool = "sim"
"""


def write_settings(directory: Path) -> Path:
    path = directory / "settings.toml"
    path.write_text(SETTINGS)
    return path


@pytest.fixture(scope="module")
async def up(tmp_path_factory):
    """One `laneway up` per module: the attacks of a module share it, as tenants share a server."""
    root = tmp_path_factory.mktemp("security")
    async with LanewayUp(
        root / "lw", KEYS["acme"], ["--settings", str(write_settings(root)), "--pii", "off", "--metrics"]
    ) as stack:
        yield stack


@pytest.fixture
async def acme(up):
    """acme's own NATS user, publishing past the bridge."""
    nc = await up.connect_nats("tenant-acme")
    yield await Publisher(nc, "acme").start()
    await nc.close()
