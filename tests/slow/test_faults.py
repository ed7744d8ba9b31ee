"""Fault injection: processes die, servers restart; nothing accepted is lost, nothing hangs.

Each test prints its counts (faults injected, accepted, completed, failed clearly, lost, hung),
which the closing notes quote.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
import nats
import pytest

from bridge.client import LanewayClient
from bridge.config import BridgeConfig
from core.natsd import NatsServer
from core.topology import StreamLimits
from loadtest.http_client import stream_chat
from loadtest.stack import Stack, demo_settings
from tests.requests import chat
from tests.wait import eventually

pytestmark = pytest.mark.slow

KEY = "sk-faults-slow"
HANG_S = 300  # how long a test waits before it calls a request hung


async def spawn(role: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        "--log-level",
        "WARNING",
        role,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def kill(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)
        await proc.wait()


def worker_args(url: str, prefix: str, *extra: str) -> list[str]:
    return [
        "--nats-url",
        url,
        "--prefix",
        prefix,
        "--pool",
        "sim",
        "--engine",
        "sim",
        "--heartbeat-interval",
        "0.5",
        "--in-progress-interval",
        "0.5",
        *extra,
    ]


async def stored(nc, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def stored_is(nc, stream: str, count: int) -> bool:
    return await stored(nc, stream) == count


def report(name: str, **counts: int) -> None:
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in counts.items()))


@pytest.mark.timeout(900)
async def test_worker_sigkill_with_200_accepted(nats_server):
    """100 streams mid-generation and 100 more accepted when the worker is SIGKILLed, some of
    those in its prefill and the rest waiting in the broker's lanes (a worker holds at most two
    engine steps of unstarted prompts: broker/lanes.py): the first go on elsewhere from their
    next token (bridge/streams/continuation.py), the second, redelivered or still waiting, complete
    elsewhere."""
    # The default ack_wait: the scheduler -NAKs a dead worker's requests once its connection is
    # gone, so nothing here waits for ack_wait. A short one (this test had 3 s) only measured how
    # late a starved machine's loops send in-progress acks: each late one is a redelivery, and the
    # fifth (max_deliver) dead-letters the request with `engine_error`, as under `pytest -n 3`.
    # Every request accepted: the bridge's measured limit and delivery-lag door would turn some of
    # the 200 away with a 503 on a loaded machine (their own tests), and this test is about what
    # was accepted when the worker died.
    doors_open = BridgeConfig(initial_stream_limit=0, max_delivery_lag_s=0)
    async with Stack(nats_server.url, demo_settings(KEY), engines=[], prefix="wk", bridge_config=doors_open) as s:
        # A slow modelled GPU (10× slower than an H100) keeps the client side of this test light.
        a = await spawn(
            "worker",
            *worker_args(
                nats_server.url,
                "wk",
                "--worker-id",
                "victim",
                "--sim-profile",
                "llama-8b-h100",
                "--sim-speed",
                "0.1",
                "--sim-kv-tokens",
                "5000000",
            ),
        )
        b = None
        try:
            await s.bridge.wait_ready(60)
            streaming = {
                "model": "laneway-sim",
                "stream": True,
                "max_tokens": 3000,
                "messages": [{"role": "user", "content": "tell me a long story"}],
            }
            # ~6,000-token prompts: 100 of them keep the slowed GPU in prefill for minutes.
            prefilling = {
                "model": "laneway-sim",
                "stream": True,
                "max_tokens": 20,
                "stream_options": {"include_usage": True},  # tokens, not chunks
                "messages": [{"role": "user", "content": "long document " * 1700}],
            }
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

                def in_flight() -> int:
                    beat = next((w for w in s.bridge.readiness.workers() if w.worker_id == "victim"), None)
                    return 0 if beat is None else beat.total_slots - beat.free_slots

                first = [asyncio.create_task(stream_chat(http, s.url, KEY, streaming)) for _ in range(100)]
                assert await eventually(lambda: in_flight() == 100, timeout=HANG_S)
                second = [asyncio.create_task(stream_chat(http, s.url, KEY, prefilling)) for _ in range(100)]
                assert await eventually(lambda: in_flight() > 100, timeout=HANG_S), [
                    t.result() for t in second if t.done()
                ][:3]
                assert await eventually(lambda: stored_is(s.broker._nc, "WK_REQ", 200), timeout=HANG_S)
                await kill(a)
                b = await spawn(
                    "worker",
                    *worker_args(
                        nats_server.url,
                        "wk",
                        "--worker-id",
                        "rescuer",
                        "--sim-profile",
                        "llama-8b-h100",
                        "--sim-speed",
                        "50",
                        "--sim-kv-tokens",
                        "5000000",
                    ),
                )
                # A bound on a hang, far past what a slow machine needs; not a window.
                _done, pending = await asyncio.wait(first + second, timeout=HANG_S)
            assert not pending, f"{len(pending)} requests hung"
            continued = [t.result() for t in first]
            moved = [t.result() for t in second]
            assert all(r.ok and r.finish_reason == "length" for r in continued), {r.error for r in continued}
            assert all(r.ok and r.tokens == 20 for r in moved), {(r.error, r.tokens) for r in moved}
            await eventually(lambda: stored_is(s.broker._nc, "WK_REQ", 0))
            left = await stored(s.broker._nc, "WK_REQ")
            report(
                "worker SIGKILL",
                faults=1,
                accepted=200,
                completed_elsewhere=len(moved),
                continued_elsewhere=len(continued),
                lost=0,
                hung=len(pending),
                left_in_stream=left,
            )
            assert left == 0
        finally:
            await kill(a)
            if b is not None:
                await kill(b, signal.SIGTERM)


@pytest.mark.timeout(900)
async def test_nats_restart_with_1000_queued(tmp_path):
    """1,000 requests accepted while no worker runs; nats-server is SIGKILLed and restarted on
    its file store; a worker then serves every one of them. No window of our own: each request
    carries its 300 s deadline, so a lost one fails by itself and the test waits for all."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    worker = None
    try:
        async with Stack(server.url, demo_settings(KEY), engines=[], prefix="rs"):
            async with LanewayClient(nc, "demo", prefix="rs") as client:

                async def one(i: int) -> int:
                    text = [t async for t in client.generate(chat(f"queued {i}", max_tokens=4), timeout_s=300)]
                    return len("".join(text).split())

                tasks = [asyncio.create_task(one(i)) for i in range(1000)]

                async def all_stored() -> bool:
                    return await stored(nc, "RS_REQ") >= 1000

                assert await eventually(all_stored, timeout=300, interval=0.1), "the 1000 requests were never stored"
                await server.kill()
                await server.start()  # same port, same store
                worker = await spawn("worker", *worker_args(server.url, "rs", "--sim-profile", "zero"))
                results = await asyncio.gather(*tasks, return_exceptions=True)
                completed = sum(1 for r in results if r == 4)
                report("nats restart", faults=1, accepted=1000, completed=completed, lost=1000 - completed, hung=0)
                assert completed == 1000, [r for r in results if r != 4][:3]
                # Acks are applied after the last frame leaves: wait for the store to drain.
                assert await eventually(lambda: stored_is(nc, "RS_REQ", 0))
    finally:
        if worker is not None:
            await kill(worker, signal.SIGTERM)
        await nc.close()
        await server.stop()


@pytest.mark.timeout(900)
async def test_broker_sigkill_rebuilds_lanes_from_unacked_messages(nats_server):
    limits = ["--ack-wait", "2"]
    broker = await spawn("broker", "--nats-url", nats_server.url, "--prefix", "bk", *limits)
    worker = None
    nc = await nats.connect(nats_server.url)
    try:
        async with Stack(
            nats_server.url, demo_settings(KEY), engines=[], prefix="bk", limits=StreamLimits(ack_wait_s=2.0)
        ) as s:
            await s.broker.stop()  # only the killable broker process serves this prefix
            async with LanewayClient(nc, "demo", prefix="bk") as client:

                async def one(i: int) -> int:
                    return len([t async for t in client.generate(chat(f"r{i}", max_tokens=3), timeout_s=120)])

                tasks = [asyncio.create_task(one(i)) for i in range(50)]
                # Accepted (stored), held unacked in the broker's lanes.
                assert await eventually(lambda: stored_is(nc, "BK_REQ", 50))
                await kill(broker)
                broker = await spawn("broker", "--nats-url", nats_server.url, "--prefix", "bk", *limits)
                worker = await spawn("worker", *worker_args(nats_server.url, "bk", "--sim-profile", "zero"))
                done, pending = await asyncio.wait(tasks, timeout=HANG_S)
                completed = sum(1 for t in done if not t.exception() and t.result() >= 1)
                report(
                    "broker SIGKILL",
                    faults=1,
                    accepted=50,
                    completed=completed,
                    lost=50 - completed - len(pending),
                    hung=len(pending),
                )
                assert completed == 50
    finally:
        await kill(broker, signal.SIGTERM)
        if worker is not None:
            await kill(worker, signal.SIGTERM)
        await nc.close()
