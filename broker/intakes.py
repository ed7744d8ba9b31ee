"""The broker's intake, one pull per priority class: a chat stored behind a flood is pulled at once.

JetStream delivers a consumer's messages in stream order. With one consumer on the whole request
stream, a chat published after 10,000 batch requests reached the lanes only once the broker had
taken all 10,000 (it holds at most `max_held`). So each class has a consumer of its own
(`core/topology.py`, made by ops), and a gating broker keeps one pull open on each.

Room is shared with the rule the lanes apply to a worker's slots: a class may fill `max_held`
only up to its `max_slot_share` of it, so a batch flood that fills the broker (batch: 90%) leaves
the rest to the classes above it, whose pulls go on. A pull asks for at most its class's room
when it is issued; pulls of several classes open at once may overshoot `max_held` by their sizes,
a bound on memory that stays soft by at most a few pulls.

A class that leaves the live set keeps its intake while this broker runs: what is stored under
it still reaches the gate, which answers it (unknown class) rather than leaving it unread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.intake import PullIntake
from core.policy.classes import ClassPolicy
from schemas.subjects import Subjects


class ClassIntakes:
    def __init__(
        self,
        nc: Client,
        s: Subjects,
        on_message: Callable[[Msg], Awaitable[None]],
        held: Callable[[], int],
        max_held: int,
        policy: Callable[[str], ClassPolicy | None],
        rank: Callable[[str], int],
    ) -> None:
        self._nc = nc
        self._s = s
        self._on_message = on_message
        self._held = held              # requests this broker holds now: in the gate, lanes, handed over
        self._max_held = max_held
        self._policy = policy
        self._rank = rank              # the catalogue's: an unknown class is served last
        self._intakes: dict[str, PullIntake] = {}
        self._starting: set[asyncio.Task[None]] = set()

    def room(self, klass: str) -> int:
        policy = self._policy(klass)
        # A class gone from the live set fills no more than the smallest share would: its
        # requests are answered, never ahead of a live class's.
        cap = policy.slot_cap(self._max_held) if policy is not None else max(1, self._max_held // 2)
        return cap - self._held()

    def follow(self, classes: Iterable[str]) -> None:
        """Pull every class in `classes` (the live set) too; the ones already pulled go on."""
        for klass in classes:
            if klass in self._intakes:
                continue
            intake = PullIntake(self._nc, self._s.req_stream, self._s.class_durable(klass),
                                self._on_message, room=lambda k=klass: self.room(k))
            self._intakes[klass] = intake
            task = asyncio.create_task(intake.start(), name=f"laneway-intake-start-{klass}")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    def poke(self) -> None:
        """Room was freed: each class with room pulls again, the highest rank first."""
        for klass in sorted(self._intakes, key=self._rank):
            if self.room(klass) > 0:
                self._intakes[klass].poke()

    async def stop(self) -> None:
        """Stop every pull; each hands on what its open pull delivered (PullIntake.stop)."""
        starting, self._starting = list(self._starting), set()
        await asyncio.gather(*starting, return_exceptions=True)
        intakes, self._intakes = list(self._intakes.values()), {}
        await asyncio.gather(*(intake.stop() for intake in intakes))
