"""A starved process is not a dead one: under `laneway up`, streams of a live worker run to their
end while CPU burners (at the same priority) starve every process, and while the bridge gets no
CPU at all for longer than a worker's silence bound (SIGSTOP: starvation taken to its limit,
the case that made a loaded bridge end live streams with `worker_lost`). A SIGKILLed worker is
still found within that bound, and its streams go on on the other worker.

Positive signals only: streams finishing, or ending with an error; the one bound asserted is
the promise itself (a dead worker's streams stall no longer than its silence bound plus one
check, with room for a loaded machine).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import pytest
import pytest_asyncio

from core.routing.health import stale_after
from loadtest.http_client import Result, stream_chat
from loadtest.processes import LanewayUp
from schemas.work import Heartbeat
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-starved"
STREAMS = 24
HANG_S = 180  # a bound on a hang, not a window
HEARTBEAT_S = 2.0  # the worker's default
# Today's bound on a worker's silence (3 missed beats + 1 s), what a continuation waits for.
BOUND_S = stale_after(Heartbeat("w", "p", "sim", "m", True, 1, 1, 0, HEARTBEAT_S), 15.0)
CHECK_S = 1.0  # the bridge checks its streams' workers this often
ROOM_S = 5.0  # a loaded CI machine's room on top
ANSWER_TOKENS = 160  # ~25 s at the slowed sim's pace: longer than the starving and the loss


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    # Two workers and two brokers, as the reference deployments run: one worker's death must not
    # touch the other's streams, and the brokers share what they hold.
    extra = [
        "--pii",
        "off",
        "--sim-profile",
        "llama-8b-h100",
        "--sim-speed",
        "0.05",
        "--workers",
        "2",
        "--brokers",
        "2",
    ]
    async with LanewayUp(tmp_path_factory.mktemp("starved") / "lw", KEY, extra) as running:
        yield running


def body(max_tokens: int) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "a long answer, please"}],
    }


def burners(n: int, seconds: float) -> list[subprocess.Popen]:
    """`n` processes that spin for `seconds`, at this process's priority (the children's too)."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


async def streams_running(
    up: LanewayUp, http: aiohttp.ClientSession, max_tokens: int
) -> tuple[list[Result], list[asyncio.Task]]:
    results = [Result() for _ in range(STREAMS)]
    load = [asyncio.create_task(stream_chat(http, up.url, KEY, body(max_tokens), result=r)) for r in results]
    assert await eventually(lambda: all(r.tokens for r in results) or any(r.error for r in results), timeout=HANG_S), (
        "streams never started"
    )
    assert not [r.error for r in results if r.error]
    return results, load


async def test_streams_of_starved_processes_run_to_their_end(up: LanewayUp) -> None:
    bridge = up.role_pids("bridge")
    assert len(bridge) == 1, bridge
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results, load = await streams_running(up, http, ANSWER_TOKENS)
        # Through the bridge's stop and the backlog it wakes to (longer only burns the suite's CPU).
        spinning = burners(2 * (os.cpu_count() or 2) + 2, 2 * BOUND_S)
        try:
            # The bridge gets no CPU for longer than a worker may be silent; the worker works on.
            os.kill(bridge[0], signal.SIGSTOP)
            await asyncio.sleep(BOUND_S + 2 * CHECK_S)  # the fault's length, not a wait for a result
            os.kill(bridge[0], signal.SIGCONT)
            _done, hung = await asyncio.wait(load, timeout=HANG_S)
        finally:
            os.kill(bridge[0], signal.SIGCONT)
            for p in spinning:
                p.kill()
                p.wait()
    assert not hung, f"{len(hung)} streams hung"
    errors = [r.error for r in results if r.error]
    assert not errors, f"streams of a live worker ended with {errors}"
    assert all(r.ok and r.finish_reason == "length" and r.tokens == ANSWER_TOKENS for r in results), [
        (r.finish_reason, r.tokens) for r in results
    ]
    assert up.role_pids("bridge") == bridge, "the bridge was restarted"


async def test_a_killed_worker_is_still_found_within_its_bound(up: LanewayUp) -> None:
    workers = up.role_pids("worker")
    assert len(workers) == 2, workers
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results, load = await streams_running(up, http, ANSWER_TOKENS)
        os.kill(workers[0], signal.SIGKILL)
        _, hung = await asyncio.wait(load, timeout=HANG_S)
    assert not hung
    # The dead worker's streams go on on the live one (bridge/streams/continuation.py): every stream
    # runs to its end, and the longest stall a client saw is the time to find the loss.
    assert {r.error for r in results} == {None}, {r.error for r in results}
    assert all(r.finish_reason == "length" and r.tokens == ANSWER_TOKENS for r in results)
    stall = max(max(r.gaps) for r in results)
    assert stall <= BOUND_S + CHECK_S + ROOM_S, f"stalled {stall:.1f} s"
