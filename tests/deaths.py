"""A worker's death, in-process: what a SIGKILL leaves the others to see, for tests that run the
stack in one process (loadtest.stack.Stack)."""

from __future__ import annotations

from workers.runner import Worker

# A stream that outlives any test's patience at the sim's speed 0.05 (~7 tokens a second).
LONG_STREAM = {
    "model": "laneway-sim",
    "stream": True,
    "max_tokens": 2000,
    "messages": [{"role": "user", "content": "a long answer, please"}],
}


async def die_without_a_word(worker: Worker) -> None:
    """Its loops and requests stop, its NATS connection closes (as a killed process's socket
    does): no drain, no ack, no last heartbeat."""
    for task in [*worker._tasks, *(a.task for a in worker._active.values() if a.task)]:
        task.cancel()
    assert worker._nc is not None
    await worker._nc.close()
