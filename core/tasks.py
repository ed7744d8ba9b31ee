"""Stopping background tasks without swallowing the caller's own cancellation.

`task.cancel(); await task` raises the task's CancelledError in the caller, and the usual
`except CancelledError: pass` around it cannot tell that one from a cancellation of the caller
itself (while the caller waits on the task, cancelling the caller cancels the task, and the
caller gets the task's CancelledError). Swallowing it there would let a cancelled shutdown run
on as if nothing happened. `asyncio.wait` never raises the task's outcome, so a CancelledError
that reaches the caller is always the caller's own.

`asyncio.wait_for` has the same flaw the other way round on Python 3.11: when what it waits
on finishes in the same step as the waiter is cancelled, it returns the result and drops the
cancellation, so a loop around it runs on and `cancel_and_wait` on that loop never returns.
`asyncio.timeout` does not; `wait_event` is the one loop-safe wait with a timeout, and `pause`
the one loop-safe sleep.

Also the one heartbeat loop the broker and the workers run.

Imports nothing of Laneway's: every process's stop path uses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import nats.errors

log = logging.getLogger("laneway.tasks")


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel `tasks` (None entries are skipped) and return once all have finished. A task that
    had already failed is logged, not raised: a stop path goes on stopping the rest."""
    pending = [task for task in tasks if task is not None]
    if not pending:
        return
    for task in pending:
        task.cancel()
    await asyncio.wait(pending)
    for task in pending:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("task %s had failed before it was stopped: %r", task.get_name(), error, exc_info=error)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True once `event` is set, False after `timeout_s`; a cancellation always propagates, even
    one a library swallowed before this call: Python 3.11's `asyncio.wait_for` (under nats-py's
    requests) returns a result that raced a cancel and drops the cancel. A loop that waits here
    between its steps would otherwise run on after `cancel_and_wait`, and its stopper hang."""
    _raise_a_swallowed_cancel()
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def pause(seconds: float) -> None:
    """`asyncio.sleep` for a loop's step: a cancel a library swallowed earlier in the step (see
    `wait_event`) ends the loop here instead of letting it run on for ever."""
    _raise_a_swallowed_cancel()
    await asyncio.sleep(seconds)


def _raise_a_swallowed_cancel() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def beat_forever(send: Callable[[], Awaitable[object]], interval_s: float) -> None:
    """Send a beat (or do any periodic NATS work) every `interval_s`; a failed one
    (disconnected) is retried by the next."""
    while True:
        try:
            await send()
        except (nats.errors.Error, OSError) as exc:
            log.debug("%s failed: %s", getattr(send, "__name__", "beat"), exc)
        await pause(interval_s)
