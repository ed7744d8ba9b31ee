"""Stopping a background task never swallows a cancellation of the caller doing the stopping
(`broker.runtime.tasks.cancel_and_wait`, used by the broker, its intake, the KV watches and the sim
engine). Only asyncio runs here: no server is needed to cancel a task."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.runtime.tasks import cancel_and_wait
from workers.sim import PROFILES, SimEngine


async def test_a_caller_cancelled_while_stopping_still_sees_cancelled_error():
    cleaning, release = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await release.wait()     # a cleanup that takes a while (a drain, a last publish)

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)           # scenario, kept: one loop turn so the task is inside its try
    caller = asyncio.create_task(cancel_and_wait(task))
    await cleaning.wait()            # the caller is now waiting for the task to finish
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
    while not loop_task.cancelling():    # the caller has cancelled the step loop and waits for it
        await asyncio.sleep(0)           # scenario, kept: one loop turn at a time, to cancel the caller mid-wait
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
