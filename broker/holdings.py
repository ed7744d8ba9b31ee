"""What a broker holds, which the intake's room is measured against: requests waiting in its lanes
(when it schedules), in its gate, and handed to the scheduler (another broker) until settled."""

from __future__ import annotations

from broker.admitting import Admitting
from broker.scheduler.origin import Origin
from broker.scheduler.schedule import Scheduler


class Holdings:
    def __init__(self, scheduler: Scheduler, origin: Origin, admitting: Admitting) -> None:
        self._scheduler = scheduler
        self._origin = origin
        self._admitting = admitting

    def __len__(self) -> int:
        return len(self._scheduler) + len(self._origin) + len(self._admitting)

    def of(self, klass: str, tenant: str) -> int:
        """One tenant's requests of a class held here: waiting in the lanes, and in the gate (of
        any class: an admission does not know its class yet). What was handed to another
        broker's schedule is not counted: its lanes share the class between tenants."""
        lanes = sum(pool.lanes.depth(klass, tenant) for pool in self._scheduler.pools.values())
        return lanes + self._admitting.of(tenant)
