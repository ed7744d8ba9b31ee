"""The supervisor behind `laneway up`: real processes that die are restarted with backoff, and
nothing is restarted once it stops."""

from __future__ import annotations

import asyncio

from laneway.supervise import Backoff, Supervisor
from tests.wait import eventually


def test_backoff_doubles_to_its_cap() -> None:
    b = Backoff(first_s=0.5, max_s=30.0)
    assert [b.delay(n) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


async def crasher() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec("sh", "-c", "exit 3")


async def sleeper() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec("sleep", "60")


async def test_a_dying_child_is_restarted_and_said_so_and_stop_ends_it() -> None:
    said: list[str] = []
    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05), say=said.append)
    steady = await sleeper()
    sup.keep("steady", steady, sleeper)
    sup.keep("crashy", await crasher(), crasher)
    assert await eventually(lambda: sup.restarts["crashy"] >= 3, timeout=30)
    assert any("crashy" in line and "exited with 3" in line for line in said)
    assert sup.procs["steady"] is steady and sup.restarts["steady"] == 0   # one crash, one child
    await sup.stop()
    count = sup.restarts["crashy"]
    assert steady.returncode is None       # stopping the supervisor leaves stopping to the caller
    steady.kill()
    await steady.wait()
    # stop() ended every keeper, so nothing is left that could restart the killed child
    assert all(keeper.done() for keeper in sup._keepers.values())
    assert sup.restarts["crashy"] == count and sup.restarts["steady"] == 0


async def test_a_start_that_fails_is_retried() -> None:
    said: list[str] = []
    attempts = 0

    async def flaky() -> asyncio.subprocess.Process:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise OSError("address already in use")
        return await sleeper()

    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05), say=said.append)
    sup.keep("flaky", await crasher(), flaky)
    assert await eventually(lambda: any("flaky restarted" in line for line in said), timeout=30)
    assert sum("did not start" in line for line in said) == 2
    await sup.stop()
    sup.procs["flaky"].kill()
    await sup.procs["flaky"].wait()
