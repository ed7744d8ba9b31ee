"""The e2e suites' default stack: bridge + broker + one zero-delay sim worker on the module's
nats-server, and the official `openai` client for it. A module with other needs defines its
own `stack` fixture, which takes precedence."""

from __future__ import annotations

import openai
import pytest

from loadtest.stack import Stack, demo_settings

KEY = "sk-test-e2e-key"


@pytest.fixture(scope="module")
async def stack(nats_server):
    async with Stack(nats_server.url, demo_settings(KEY)) as s:
        yield s


@pytest.fixture
def client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
