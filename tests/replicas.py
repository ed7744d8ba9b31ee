"""Another bridge replica on a `laneway up` stack, as behind a load balancer: a `laneway bridge`
process joining `up`'s NATS as the generated bridge user, with the stack's idempotency secret
(every replica's), stopped with Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from core.ports import free_port
from loadtest.processes import LanewayUp


@asynccontextmanager
async def another_bridge(up: LanewayUp, *extra: str) -> AsyncIterator[str]:
    """A second bridge process on `up`'s NATS (`extra`: its flags); yields its URL, and asserts
    it exits cleanly when stopped."""
    port = free_port()
    secret = (up.data_dir / "idempotency.key").read_text().strip()
    bridge = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        "bridge",
        "--nats-url",
        up.nats_url,
        "--port",
        str(port),
        *extra,
        env=up.nats_env("svc-bridge") | {"LANEWAY_IDEMPOTENCY_SECRET": secret},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert bridge.stdout is not None  # a PIPE
    drain = None
    try:
        said = b""
        while b"laneway bridge on" not in said:
            line = await asyncio.wait_for(bridge.stdout.readline(), 60)
            assert line, f"the second bridge exited: {said.decode()}"
            said += line
        drain = asyncio.create_task(bridge.stdout.read())  # keep its pipe from filling
        yield f"http://127.0.0.1:{port}"
    finally:
        bridge.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(bridge.wait(), 30) == 0
        if drain is not None:
            drain.cancel()
