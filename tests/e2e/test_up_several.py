"""`laneway up --brokers 2 --workers 2`: two of each, each its own process with its own log and
metrics port, each worker with its own id; a streamed chat is served, and Ctrl-C stops them all."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import openai
import pytest

from loadtest.processes import LanewayUp, metrics_port
from schemas.subjects import Subjects
from tests.replicas import another_bridge
from tests.wait import eventually

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children")

KEY = "sk-up-several"


async def test_up_with_two_brokers_and_two_workers_streams_a_chat(tmp_path):
    data_dir = tmp_path / "lw"
    extra = ["--pii", "off", "--brokers", "2", "--workers", "2", "--metrics", "--sim-profile", "llama-8b-h100"]
    async with LanewayUp(data_dir, KEY, extra) as up:
        assert "processes   2 brokers, 2 workers, 1 bridge" in up.banner
        children = up.role_pids("broker") + up.role_pids("worker")
        assert len(up.role_pids("broker")) == 2 and len(up.role_pids("worker")) == 2, children
        ports = {metrics_port(pid) for pid in children}
        assert None not in ports and len(ports) == 4, ports
        async with aiohttp.ClientSession() as http:
            for port in ports:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    assert resp.status == 200 and "laneway_" in await resp.text()

        # Each worker heartbeats under an id of its own.
        nc = await up.connect_nats("svc-bridge")
        worker_ids: set[str] = set()

        async def seen(msg) -> None:
            worker_ids.add(msg.subject.rsplit(".", 1)[1])

        await nc.subscribe(Subjects().worker_events, cb=seen)
        await nc.publish(Subjects().worker_ping, b"")
        assert await eventually(lambda: len(worker_ids) == 2), worker_ids
        await nc.close()

        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0)
        stream = await client.chat.completions.create(
            model="laneway-sim", stream=True, max_tokens=8, messages=[{"role": "user", "content": "Hello!"}]
        )
        chunks = [c async for c in stream if c.choices]
        await client.close()
        assert len("".join(c.choices[0].delta.content or "" for c in chunks).split()) == 8
        assert chunks[-1].choices[0].finish_reason == "length"
    assert await eventually(lambda: up.pids() == []), up.pids()  # Ctrl-C stopped every child
    logs = {p.name for p in (data_dir / "logs").iterdir()}
    assert {"broker-1.log", "broker-2.log", "worker-1.log", "worker-2.log", "bridge.log"} <= logs, logs


async def test_a_second_bridge_on_the_same_nats_serves_the_same_tenants(tmp_path):
    """Bridges are stateless: a `laneway bridge` joining `up`'s NATS as the generated bridge user
    knows the same tenants (from KV), and both bridges serve at once."""
    async with LanewayUp(tmp_path / "lw", KEY, ["--pii", "off"]) as up:
        async with another_bridge(up) as second:
            clients = [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) for url in (up.url, second)]

            async def chat(client: openai.AsyncOpenAI) -> tuple[str, int]:
                stream = await client.chat.completions.create(
                    model="laneway-sim",
                    stream=True,
                    max_tokens=8,
                    stream_options={"include_usage": True},
                    messages=[{"role": "user", "content": "Hello!"}],
                )
                reasons, tokens = [], 0
                async for chunk in stream:
                    reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
                    tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                return reasons[-1], tokens

            answers = await asyncio.gather(*(chat(clients[i % 2]) for i in range(10)))
            assert answers == [("length", 8)] * 10
            for client in clients:
                await client.close()
