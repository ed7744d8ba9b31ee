"""`laneway up` supervises: each child SIGKILLed under load is restarted, the others run on,
no client hangs, and service comes back.

One `up` for the module; each test kills one role while 16 streams are mid-generation, then
waits for positive signals only: `up` saying it restarted the role, every stream ending (with
its tokens or a clear error), a fresh request being served.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest
import pytest_asyncio

from loadtest.http_client import Result, stream_chat
from loadtest.processes import LanewayUp
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-supervise"
ROLES = ("nats-server", "broker", "worker", "bridge")
STREAMS = 16
ANSWER_TOKENS = 160  # ~25 s at the slowed sim's pace: mid-generation for the whole kill and restart
HANG_S = 120  # a bound on a hang, not a window: each case ends in seconds
# How a stream cut by each role's death may end, besides completing: the bridge's death cuts
# the connection; a worker's ends streams it served with worker_lost; a nats-server's makes
# the bridge fail its open streams at once with `unavailable`. A broker's death loses nothing.
ALLOWED = {
    "worker": {"worker_lost"},
    "broker": set(),
    "nats-server": {"unavailable", "worker_lost"},
    "bridge": {"ClientPayloadError", "ServerDisconnectedError", "ClientOSError"},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = ["--pii", "off", "--sim-profile", "llama-8b-h100", "--sim-speed", "0.05", "--heartbeat-interval", "0.5"]
    async with LanewayUp(tmp_path_factory.mktemp("supervise") / "lw", KEY, extra) as running:
        yield running


def body(max_tokens: int) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "a long answer, please"}],
    }


async def served(up: LanewayUp) -> bool:
    async with aiohttp.ClientSession() as http:
        try:
            result = await stream_chat(http, up.url, KEY, body(4))
        except aiohttp.ClientError:
            return False
    return result.ok and result.tokens > 0


@pytest.mark.parametrize("role", ROLES)
async def test_a_child_killed_under_load_is_restarted(up: LanewayUp, role: str) -> None:
    assert await eventually(lambda: served(up), timeout=HANG_S), "not serving before the kill"
    victim = up.role_pids(role)
    assert len(victim) == 1, victim
    others = {r: up.role_pids(r) for r in ROLES if r != role}
    restarts = sum(f"{role} restarted" in line for line in up.output)

    results = [Result() for _ in range(STREAMS)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        load = [asyncio.create_task(stream_chat(http, up.url, KEY, body(ANSWER_TOKENS), result=r)) for r in results]
        # Under load: every stream has tokens on the wire.
        assert await eventually(lambda: all(r.tokens for r in results), timeout=HANG_S), [
            r.error for r in results if r.error
        ]
        os.kill(victim[0], signal.SIGKILL)
        done, hung = await asyncio.wait(load, timeout=HANG_S)
    assert not hung, f"{len(hung)} streams hung after the {role} was killed"

    ends = {t.result().error for t in done}
    assert ends - {None} <= ALLOWED[role], ends
    assert await eventually(
        lambda: sum(f"{role} restarted" in line for line in up.output) > restarts, timeout=HANG_S
    ), up.output[-5:]
    assert await eventually(lambda: served(up), timeout=HANG_S), f"not serving after the {role} restarted"
    assert {r: up.role_pids(r) for r in others} == others, "another child was restarted too"
    assert up.role_pids(role) not in ([], victim)
