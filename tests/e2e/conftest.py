"""The e2e suites' default stack: bridge + broker + one zero-delay sim worker on the module's
nats-server, and the official `openai` client for it. A module with other needs defines its
own `stack` fixture, which takes precedence."""

from __future__ import annotations

import asyncio
import gc

import openai
import pytest

from loadtest.stack import Stack, demo_settings

KEY = "sk-test-e2e-key"


@pytest.fixture(scope="module", autouse=True)
async def _garbage_of_the_module_in_its_loop():
    """What a module's tests left to the garbage collector (an `openai` client never closed) is
    collected while the module's event loop still runs: the client's finalizer closes its
    connections on that loop, not on a later module's, whose log would show 'Event loop is
    closed' in the middle of a test that asserts on its log (test_edge_limits)."""
    yield
    gc.collect()
    for _ in range(3):          # the close tasks the finalizers scheduled, and theirs
        await asyncio.sleep(0)


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY)) as s:
        yield s


@pytest.fixture
def client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
