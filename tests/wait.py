"""Waiting in tests for a positive signal, never for a fixed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0, interval: float = 0.05
) -> bool:
    """True as soon as `predicate` (sync or async) holds; False if it never did within
    `timeout`. The timeout is a bound on a hang, not a window the behaviour must fit in."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
