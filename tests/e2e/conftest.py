"""The e2e suites' default stack: bridge + broker + one zero-delay sim worker on the module's
nats-server, and the official `openai` client for it. A module with other needs defines its
own `stack` fixture, which takes precedence."""

from __future__ import annotations

import asyncio
import gc

import openai
import pytest

from bridge.config import BridgeConfig
from loadtest.stack import Stack, demo_settings

KEY = "sk-test-e2e-key"
# The bridge's load shedding (the measured stream limit, refusal while delivery runs late) reads
# the machine's speed: on a loaded CI runner it refused the 64 streams of test_many_concurrent_streams
# ("holds 29 of the 29 open streams"). Those limits are tested with their own clock
# (tests/unit/test_stream_limit.py, test_admission*.py); here a verdict must not depend on speed.
STEADY = BridgeConfig(initial_stream_limit=0, max_delivery_lag_s=0)


@pytest.fixture(scope="module", autouse=True)
async def _garbage_of_the_module_in_its_loop():
    """What a module's tests left to the garbage collector (an `openai` client never closed) is
    collected while the module's event loop still runs: the client's finalizer closes its
    connections on that loop, not on a later module's, whose log would show 'Event loop is
    closed' in the middle of a test that asserts on its log (test_edge_limits)."""
    yield
    gc.collect()
    for _ in range(3):  # the close tasks the finalizers scheduled, and theirs
        await asyncio.sleep(0)


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY), bridge_config=STEADY) as s:
        yield s


@pytest.fixture
def client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
