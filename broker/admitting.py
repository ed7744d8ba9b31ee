"""Requests under admission, side by side: one tenant's slow admissions never hold up another's.

The intake's subscription hands over one message at a time, in stream order. Admitted there, a
tenant's flood of long prompts (each hundreds of milliseconds in the PII pool) would hold every
other tenant's request at the gate behind the whole flood, whatever share of the pool each
tenant's jobs may take. So each message is admitted in a task of its own:

- a tenant has at most `per_tenant` admissions running; its others wait by class, then in
  arrival order (`broker/share.py`), so one tenant cannot start unbounded gate work, and its chat
  arriving behind thousands of its own batch requests is the next one through;
- messages with the same (tenant, request id) are admitted one after another, so the gate's
  duplicate check sees how the earlier one ended;
- `len()` counts every message not yet through, so the intake's room covers them: no pull brings
  in more than the broker may hold.

    admitting.submit(tenant, request_id, rank, lambda: admit(msg))   # from the subscription callback
    await admitting.wait_idle()                                  # stopping: all of them through

A task that raises is logged and its message left unacked: JetStream delivers it again after
`ack_wait`, as when the callback itself raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from broker.share import TenantShare

log = logging.getLogger("laneway.intake")

DEFAULT_PER_TENANT = 32


class Admitting:
    def __init__(self, per_tenant: int = DEFAULT_PER_TENANT, on_ended: Callable[[], None] = lambda: None) -> None:
        """`on_ended` runs as each admission ends (room came back: the intake may pull again)."""
        self._share = TenantShare(per_tenant)
        self._on_ended = on_ended
        self._tasks: set[asyncio.Task[None]] = set()
        self._last: dict[tuple[str, str], asyncio.Task[None]] = {}  # the latest task of each id
        self._per_tenant: Counter[str] = Counter()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._tasks)

    def of(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    def submit(self, tenant: str, request_id: str, rank: int, admit: Callable[[], Awaitable[None]]) -> None:
        """`rank`: the request's class rank (0 first), its place among the tenant's waiting ones."""
        key = (tenant, request_id)
        task = asyncio.create_task(self._run(tenant, rank, self._last.get(key), admit), name=f"laneway-admit-{tenant}")
        self._last[key] = task
        self._tasks.add(task)
        self._per_tenant[tenant] += 1
        self._idle.clear()
        task.add_done_callback(lambda t: self._ended(key, t))

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _run(
        self, tenant: str, rank: int, before: asyncio.Task[None] | None, admit: Callable[[], Awaitable[None]]
    ) -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own (logged there), not ours
        await self._share.take(tenant, rank=rank)
        try:
            await admit()
        except Exception:
            # The loop boundary, as the intake's: the message stays unacked and comes back.
            log.exception("admitting a request of %s failed", tenant)
        finally:
            self._share.give_back(tenant)

    def _ended(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._per_tenant[key[0]] -= 1
        if not self._per_tenant[key[0]]:
            del self._per_tenant[key[0]]
        if self._last.get(key) is task:
            del self._last[key]
        if not self._tasks:
            self._idle.set()
        self._on_ended()
