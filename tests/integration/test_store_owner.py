"""A JetStream store has one owner (core/owner.py): a second nats-server on it is refused before
it starts, naming the first, and the first serves on; the store is free again once it stops."""

from __future__ import annotations

import os
from pathlib import Path

import nats
import pytest

from core.natsd import NatsServer
from core.owner import DirInUse


async def test_a_second_server_on_a_store_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = NatsServer(tmp_path / "nats")
    async with first:
        nc = await nats.connect(first.url)
        js = nc.jetstream()
        await js.add_stream(name="KEPT", subjects=["kept"])
        await js.publish("kept", b"one")

        second = NatsServer(tmp_path / "nats")
        with pytest.raises(DirInUse) as refused:
            await second.start()
        assert refused.value.alive and refused.value.owner.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(refused.value) and first.url in str(refused.value)
        assert second.process is None

        await js.publish("kept", b"two")  # the first serves on, its store whole
        assert (await js.stream_info("KEPT")).state.messages == 2
        await nc.close()

    async with NatsServer(tmp_path / "nats") as after:  # stopped: the store is free
        nc = await nats.connect(after.url)
        assert (await nc.jetstream().stream_info("KEPT")).state.messages == 2
        await nc.close()
