"""Shared fixtures: a real nats-server per test module (port 0, temporary store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


@pytest.fixture(scope="module")
async def nats_server(tmp_path_factory: pytest.TempPathFactory):
    from broker.runtime.natsd import NatsServer

    server = NatsServer(Path(tmp_path_factory.mktemp("nats")))
    await server.start()
    yield server
    await server.stop()
