"""Stopping a background task never swallows a cancellation of the caller doing the stopping
(`core.tasks.cancel_and_wait`, used by the broker, its intake, the KV watches and the sim
engine). Only asyncio runs here: no server is needed to cancel a task."""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path

import pytest

from core.tasks import cancel_and_wait, pause, wait_event
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES


async def test_a_caller_cancelled_while_stopping_still_sees_cancelled_error():
    cleaning, release = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await release.wait()  # a cleanup that takes a while (a drain, a last publish)

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)  # scenario, kept: one loop turn so the task is inside its try
    caller = asyncio.create_task(cancel_and_wait(task))
    await cleaning.wait()  # the caller is now waiting for the task to finish
    caller.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert task.done() and task.cancelled()


async def test_the_sim_engine_cleanup_passes_its_callers_cancellation_on():
    engine = SimEngine(PROFILES["zero"])
    await engine.start()
    loop_task = engine._loop_task
    caller = asyncio.create_task(engine.cleanup())
    while not loop_task.cancelling():  # the caller has cancelled the step loop and waits for it
        await asyncio.sleep(0)  # scenario, kept: one loop turn at a time, to cancel the caller mid-wait
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait([loop_task])
    assert loop_task.cancelled()


async def test_stopping_tasks_that_already_failed_logs_them_and_stops_the_rest(caplog):
    async def fails() -> None:
        raise RuntimeError("broken loop")

    failed = asyncio.create_task(fails(), name="broken")
    running = asyncio.create_task(asyncio.Event().wait(), name="idle")
    await asyncio.wait([failed])
    with caplog.at_level(logging.ERROR, logger="laneway.tasks"):
        await cancel_and_wait(failed, None, running)
    assert running.cancelled()
    assert "broken" in caplog.text and "broken loop" in caplog.text


async def _stops_when_woken_and_cancelled_in_one_step(loop_body) -> bool:
    """A loop that waits on an event with a timeout, woken in the same step as it is cancelled:
    on Python 3.11 `asyncio.wait_for` returns there and drops the cancellation."""
    wake = asyncio.Event()

    async def forever() -> None:
        while True:
            wake.clear()
            await loop_body(wake)

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)  # scenario, kept: one loop turn so the task waits on the event
    wake.set()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    if not done:
        await cancel_and_wait(task)  # the second cancel lands; only the verdict matters here
    return bool(done) and task.cancelled()


async def test_a_loop_waiting_on_an_event_is_stopped_by_a_cancel_that_comes_with_a_wake():
    assert await _stops_when_woken_and_cancelled_in_one_step(lambda wake: wait_event(wake, 1.0))


@pytest.mark.parametrize(
    "next_wait", [lambda: wait_event(asyncio.Event(), 30.0), lambda: pause(30.0)], ids=["wait_event", "pause"]
)
async def test_a_cancel_a_library_swallowed_still_ends_a_loop_at_its_next_wait(next_wait):
    """nats-py's requests run on Python 3.11's `asyncio.wait_for`, which drops a cancel that races
    their reply: the scheduler lease's loop then ran on, and a stop waiting on it hung (seen in
    the parallel suite). The next wait_event or pause raises the cancel the task still carries."""
    swallowed = asyncio.Event()

    async def a_loop() -> None:
        while True:
            try:
                await asyncio.sleep(30)  # a request whose reply raced the cancel
            except asyncio.CancelledError:
                swallowed.set()  # ...and the library returned its result instead
            await next_wait()

    task = asyncio.create_task(a_loop())
    await asyncio.sleep(0)  # scenario, kept: one loop turn so the task is inside its request
    task.cancel()
    await swallowed.wait()
    done, _ = await asyncio.wait([task], timeout=10.0)  # a bound on a hang: it ends at once
    assert done and task.cancelled()


async def test_wait_event_says_whether_the_event_was_set():
    event = asyncio.Event()
    assert not await wait_event(event, 0.01)
    event.set()
    assert await wait_event(event, 0.01)


def test_no_process_waits_with_asyncio_wait_for():
    """Each of its uses was a loop or a stop path that a cancel must end (see wait_event)."""
    root = Path(__file__).resolve().parents[2]
    users = [
        str(path.relative_to(root))
        for package in ("schemas", "core", "bridge", "broker", "workers", "laneway")
        for path in (root / package).rglob("*.py")
        if "wait_for(" in path.read_text()
    ]
    assert users == []


def _sleeps_in_loops(source: str) -> list[int]:
    """Lines where a loop's body awaits `asyncio.sleep` with a non-zero delay (nested functions
    are their own scope and are not counted)."""
    found: list[int] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                visit(child, False)
                continue
            if (
                in_loop
                and isinstance(child, ast.Await)
                and isinstance(call := child.value, ast.Call)
                and ast.unparse(call.func) == "asyncio.sleep"
                and not (call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0)
            ):
                found.append(child.lineno)
            visit(child, in_loop or isinstance(child, ast.While | ast.For | ast.AsyncFor))

    visit(ast.parse(source), False)
    return found


def test_no_loop_of_a_process_pauses_with_asyncio_sleep():
    """A loop that makes NATS requests between its sleeps may have had its cancel swallowed by
    one (see wait_event); `pause` ends it at its next step, `asyncio.sleep` would not: the loop
    ran on, and the stop that waited on it hung (seen in the parallel suite)."""
    root = Path(__file__).resolve().parents[2]
    users = [
        f"{path.relative_to(root)}:{line}"
        for package in ("schemas", "core", "bridge", "broker", "workers", "laneway")
        for path in sorted((root / package).rglob("*.py"))
        for line in _sleeps_in_loops(path.read_text())
    ]
    assert users == []
