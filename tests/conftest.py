"""Shared fixtures: a real nats-server per test module (port 0, temporary store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


@pytest.fixture(scope="module")
async def nats_server(tmp_path_factory: pytest.TempPathFactory):
    from broker.runtime.natsd import SHARED_DISK_FILE_STORE, NatsServer

    # JetStream reserves each stream's max_bytes (4 GiB per request stream, one per prefix, and
    # a module's tests use many prefixes) against a limit that is by default 75% of the disk's
    # free space: a fixed one keeps whether they fit off the machine's disk.
    server = NatsServer(Path(tmp_path_factory.mktemp("nats")), max_file_store=SHARED_DISK_FILE_STORE)
    await server.start()
    yield server
    await server.stop()
