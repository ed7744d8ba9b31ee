"""The supervisor behind `laneway up`: real processes that die are restarted with backoff, and
nothing is restarted once it stops."""

from __future__ import annotations

import asyncio

from core.lifetime import end_group
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
    # crash_loop_s 0: no exit is quick, so a crash loop is restarted for ever (its own test below)
    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05, crash_loop_s=0.0), say=said.append)
    steady = await sleeper()
    sup.keep("steady", steady, sleeper)
    sup.keep("crashy", await crasher(), crasher)
    assert await eventually(lambda: sup.restarts["crashy"] >= 3, timeout=30)
    assert any("crashy" in line and "exited with 3" in line for line in said)
    assert sup.procs["steady"] is steady and sup.restarts["steady"] == 0  # one crash, one child
    await sup.stop()
    count = sup.restarts["crashy"]
    assert steady.returncode is None  # stopping the supervisor leaves stopping to the caller
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


async def test_a_child_that_fails_the_same_way_twice_in_a_row_is_not_restarted_again() -> None:
    """A port taken, a bad flag: the second quick exit with the same code says restarting only
    repeats it. The supervisor gives up on that child, says why, and tells `up` (gave_up)."""
    said: list[str] = []
    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05, crash_loop_s=10.0), say=said.append)
    steady = await sleeper()
    sup.keep("steady", steady, sleeper)
    sup.keep("bridge", await crasher(), crasher)
    assert await eventually(sup.gave_up.is_set, timeout=30)
    assert sup.failed == "bridge" and sup.restarts["bridge"] == 1
    assert "exited with 3" in sup.why and "not restarting it" in sup.why and said[-1] == sup.why
    assert steady.returncode is None and sup.restarts["steady"] == 0, "the others run on"
    await sup.stop()
    steady.kill()
    await steady.wait()


async def test_quick_exits_that_differ_are_still_restarted() -> None:
    codes = iter(range(3, 100))

    async def varied() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec("sh", "-c", f"exit {next(codes)}")

    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05, crash_loop_s=10.0), say=lambda line: None)
    sup.keep("worker", await varied(), varied)
    assert await eventually(lambda: sup.restarts["worker"] >= 3, timeout=30)
    assert not sup.gave_up.is_set()
    await sup.stop()


async def test_what_a_killed_child_left_in_its_group_ends_with_it(tmp_path) -> None:
    """A worker SIGKILLed leaves vLLM's engine core behind (it asks for no death signal): the
    supervisor ends the dead child's process group before starting the next, as `up` starts
    each child in a session of its own."""
    pids = tmp_path / "grandchild"

    async def parent() -> asyncio.subprocess.Process:
        script = f"sleep 300 & echo $! > {pids}; wait"
        return await asyncio.create_subprocess_exec("sh", "-c", script, start_new_session=True)

    first = await parent()
    assert await eventually(lambda: pids.exists() and pids.read_text().strip(), timeout=30)
    grandchild = int(pids.read_text())
    pids.unlink()
    sup = Supervisor(backoff=Backoff(first_s=0.01, max_s=0.05), say=lambda line: None)
    sup.keep("worker", first, parent)
    first.kill()
    assert await eventually(lambda: not alive(grandchild), timeout=30), "the dead child's child lives on"
    assert await eventually(lambda: sup.restarts["worker"] == 1 and pids.exists(), timeout=30)
    await sup.stop()
    sup.procs["worker"].kill()
    await sup.procs["worker"].wait()
    end_group(sup.procs["worker"].pid)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
