"""What the scheduler handed to each worker and has not seen end (no usage record yet), so that a
lost worker's requests go back to JetStream at once (`-NAK`, redelivered now) instead of after
`ack_wait`: their streams then go on on another worker within seconds (bridge/streams/continuation.py).

A worker is lost when it has been silent (no heartbeat) past the bound the bridge's worker-loss
check uses (core/routing/health.py `stale_after`: 3 missed beats, stretched by the lateness its
loop last reported), plus how late the scheduler's own loop runs: a beat it has not read yet is
not a missing one. A false loss costs work, never an answer: the request is delivered again, its
edge moves the stream to the new worker, and the old worker's frames are dropped as stale.

Only the scheduler holds this, in memory: a new scheduler does not know what its predecessor
dispatched, and those requests come back after `ack_wait`, as before. Pure state; the sweep naks.

A worker judged lost that was only silent (a stalled loop, a partition) would go on generating
what another worker now continues: two generations, two usage records. The sweep fences it
first (`schemas.work.Fence`): when it reads the fence it drops those requests without a trace.
A fence published while the worker's connection was down never reaches it: the fence is kept
until those requests' deadlines and sent again with the worker's next pull, which says it is back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker.waiting import Item
from schemas.work import Fence, Fenced

KEEP_PAST_DEADLINE_S = 60.0  # an entry whose usage never came is dropped this long after its deadline

Key = tuple[str, str]  # (tenant, request id)


@dataclass(frozen=True, slots=True)
class HandedBack:
    key: Key
    ack_subject: str
    attempt: int


@dataclass(slots=True)
class _Dispatched:
    worker: str
    ack_subject: str
    deadline: float
    attempt: int


class Running:
    def __init__(self) -> None:
        self._by_key: dict[Key, _Dispatched] = {}
        self._by_worker: dict[str, set[Key]] = {}
        self._fences: dict[str, tuple[list[HandedBack], float]] = {}  # worker → fenced from, until

    def __len__(self) -> int:
        return len(self._by_key)

    def placed(self, worker: str, items: Iterable[Item]) -> None:
        """A worker's pull took these lane items (their payload a `broker.pools.Held`)."""
        for item in items:
            self.add(worker, item.key, item.payload.ack.reply, item.deadline, item.payload.attempt)

    def add(self, worker: str, key: Key, ack_subject: str, deadline: float, attempt: int = 1) -> None:
        self.ended(key)
        self._by_key[key] = _Dispatched(worker, ack_subject, deadline, attempt)
        self._by_worker.setdefault(worker, set()).add(key)

    def ended(self, key: Key) -> None:
        """Its usage record came (finished, failed, cancelled, escalated)."""
        gone = self._by_key.pop(key, None)
        if gone is not None:
            keys = self._by_worker.get(gone.worker)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_worker[gone.worker]

    def workers(self) -> list[str]:
        return list(self._by_worker)

    def lost(self, worker: str) -> list[HandedBack]:
        """The worker is gone: its requests, forgotten here; its fence kept for `fence_again`."""
        keys = self._by_worker.pop(worker, set())
        out = []
        until = 0.0
        for key in keys:
            d = self._by_key.pop(key)
            out.append(HandedBack(key, d.ack_subject, d.attempt))
            until = max(until, d.deadline)
        if out:
            before, kept = self._fences.get(worker, ([], 0.0))
            self._fences[worker] = ([*before, *out], max(until, kept))
        return out

    def fence_again(self, worker: str, now: float) -> Fence | None:
        """The fence of a worker judged lost that pulls again (it is back), once; None if none is
        kept or all its requests' deadlines passed."""
        gone, until = self._fences.pop(worker, ([], 0.0))
        return fence(gone) if gone and now < until else None

    def expire(self, now: float) -> None:
        for key in [k for k, d in self._by_key.items() if now - d.deadline > KEEP_PAST_DEADLINE_S]:
            self.ended(key)
        for worker in [w for w, (_, until) in self._fences.items() if now >= until]:
            del self._fences[worker]


def fence(gone: list[HandedBack]) -> Fence:
    """What a worker judged lost must drop: these deliveries (a later one is not fenced)."""
    return Fence([Fenced(g.key[0], g.key[1], g.attempt) for g in gone])
