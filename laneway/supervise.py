"""`laneway up`'s children kept alive: a crashed one is restarted with backoff, and says so.

One crash never takes the others down: each child has its own keeper task. Brokers rebuild
their lanes from unacked messages, workers re-register by heartbeat, the bridge re-binds its
port, and every process reconnects to a restarted nats-server by itself, so restarting the one
that died is all that is needed, once what it left in its process group is ended (vLLM's engine
core, which would hold the GPU from its successor: `core.lifetime.end_group`). A child that keeps crashing is restarted ever more slowly
(backoff doubling to `max_s`); one that stayed up for `reset_after_s` starts the count afresh.
A child that fails the same way twice in a row (the same exit code, each time within
`crash_loop_s` of its start: a port taken, a bad flag, a model that does not load) is not
restarted again: restarting would only repeat it. The supervisor says so and sets `gave_up`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from core.lifetime import end_group
from core.tasks import cancel_and_wait, wait_event

Start = Callable[[], Awaitable[asyncio.subprocess.Process]]


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5
    max_s: float = 30.0
    reset_after_s: float = 60.0
    crash_loop_s: float = 10.0

    def delay(self, restarts: int) -> float:
        """The wait before restart number `restarts + 1` in a row."""
        return min(self.max_s, self.first_s * 2**restarts)


@dataclass
class Supervisor:
    """Keeps each started child running until `stop()`; `procs` holds the live processes."""

    backoff: Backoff = field(default_factory=Backoff)
    say: Callable[[str], None] = lambda line: print(f"laneway: {line}", file=sys.stderr, flush=True)
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # total per role
    gave_up: asyncio.Event = field(default_factory=asyncio.Event)  # a child failed in a loop
    why: str = ""  # ... how
    failed: str = ""  # ... and which
    _keepers: dict[str, asyncio.Task] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def keep(self, role: str, proc: asyncio.subprocess.Process, start: Start) -> None:
        """Watch `proc` (already started and ready) and restart it with `start` whenever it dies."""
        self.procs[role] = proc
        self.restarts.setdefault(role, 0)
        self._keepers[role] = asyncio.create_task(self._keep(role, proc, start), name=f"keep-{role}")

    async def _keep(self, role: str, proc: asyncio.subprocess.Process, start: Start) -> None:
        loop = asyncio.get_running_loop()
        in_a_row = 0
        quick_code: int | None = None  # the exit code of the last exit soon after a start
        started = loop.time()
        while True:
            code = await proc.wait()
            end_group(proc.pid)
            if self._stopping.is_set():
                return
            lived = loop.time() - started
            if lived >= self.backoff.reset_after_s:
                in_a_row = 0
            quick = lived < self.backoff.crash_loop_s
            if quick and code == quick_code:
                self.why = (
                    f"{role} (pid {proc.pid}) exited with {code} {lived:.1f}s after its start, "
                    "the same as the time before; not restarting it"
                )
                self.say(self.why)
                self.failed = role
                self.gave_up.set()
                return
            quick_code = code if quick else None
            self.restarts[role] += 1
            self.say(
                f"{role} (pid {proc.pid}) exited with {code} after {lived:.1f}s; "
                f"restarting in {self.backoff.delay(in_a_row):.1f}s (restart {self.restarts[role]})"
            )
            while True:  # until a start succeeds: each try waits its backoff first
                delay = self.backoff.delay(in_a_row)
                in_a_row += 1
                if await self._stopped_within(delay):
                    return
                started = loop.time()
                try:
                    proc = await start()
                    break
                except (OSError, RuntimeError) as exc:  # e.g. the port is not free yet
                    self.say(f"{role} did not start ({exc}); trying again in {self.backoff.delay(in_a_row):.1f}s")
            self.procs[role] = proc
            self.say(f"{role} restarted (pid {proc.pid})")

    async def _stopped_within(self, seconds: float) -> bool:
        return await wait_event(self._stopping, seconds)

    async def stop(self) -> None:
        """No more restarts; the caller then stops `procs` in its own order."""
        self._stopping.set()
        await cancel_and_wait(*self._keepers.values())
