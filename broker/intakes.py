"""The broker's intake, one pull per (priority class, tenant): nothing waits behind what it
should not.

JetStream delivers a consumer's messages in stream order. With one consumer on the whole request
stream, a chat published after 10,000 batch requests reached the lanes only once the broker had
taken all 10,000 (it holds at most `max_held`); with one per class, one tenant's chat waited
behind another tenant's backlog in that class, junk included. So each (class, tenant) pair has a
consumer of its own (`core/topology.py`, made by ops), and a gating broker keeps one pull open on
each: the lanes, not the stream's order, decide what runs first.

Room is shared with the rules the lanes apply to a worker's slots: a class may fill `max_held`
only up to its `max_slot_share` of it, so a batch flood that fills the broker (batch: 90%) leaves
the rest to the classes above it, whose pulls go on; and one tenant only up to `max_tenant_share`
of its class's part, so another tenant's request in that class still finds a place (a lone
tenant, with a broker that holds thousands, loses nothing by it). A pull asks for at most
`PULL_BATCH` and its room when it is issued; pulls open at once may overshoot `max_held` by at
most `PULL_BATCH` each (pairs x 16), a soft bound on memory.

What the broker cannot read costs its sender: after a message that was junk, its pair's next pull
waits (`PullIntake`), so a flood of junk is read at a trickle while it fills its sender's own
backlog (JetStream then refuses the sender's publishes), and nobody else's request waits for it.

A class or tenant that leaves the live set keeps its intake while this broker runs: what is
stored under it still reaches the gate, which answers it rather than leaving it unread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.holdings import Holdings
from broker.intake import PullIntake
from core.catalogue import Catalogue
from schemas.subjects import Subjects

PULL_BATCH = 16  # one pull's most: a tenant's flood takes its room a pull at a time


class Intakes:
    def __init__(
        self,
        nc: Client,
        s: Subjects,
        on_message: Callable[[Msg], Awaitable[bool]],
        held: Holdings,
        max_held: int,
        live: Catalogue,
    ) -> None:
        self._nc = nc
        self._s = s
        self._on_message = on_message  # False: the message was junk (unreadable, or not its sender's)
        self._held = held  # requests this broker holds now: in the gate, lanes, handed over
        self._max_held = max_held
        self._live = live  # the classes (their shares, their rank) and the tenants
        self._intakes: dict[tuple[str, str], PullIntake] = {}
        self._by_rank: list[tuple[tuple[str, str], PullIntake]] = []  # poke's order, made in `follow`
        self._starting: set[asyncio.Task[None]] = set()

    def room(self, klass: str, tenant: str) -> int:
        policy = self._live.classes.get(klass)
        if policy is None:
            # A class gone from the live set fills no more than the smallest share would: its
            # requests are answered, never ahead of a live class's.
            return max(1, self._max_held // 2) - len(self._held)
        return min(
            policy.slot_cap(self._max_held) - len(self._held),
            policy.tenant_slot_cap(self._max_held) - self._held.of(klass, tenant),
        )

    def follow(self) -> None:
        """Pull every (class, tenant) of the live sets too; the pairs already pulled go on."""
        tenants = [t.name for t in self._live.tenants]
        for klass in list(self._live.classes):
            for tenant in tenants:
                if (klass, tenant) in self._intakes:
                    continue
                intake = PullIntake(
                    self._nc,
                    self._s.req_stream,
                    self._s.intake_durable(klass, tenant),
                    self._on_message,
                    room=functools.partial(self.room, klass, tenant),
                    batch=PULL_BATCH,
                )
                self._intakes[klass, tenant] = intake
                task = asyncio.create_task(intake.start(), name=f"laneway-intake-start-{klass}-{tenant}")
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)
        # Sorted here, not at each poke (one per admission ended): a rank changes only with the classes.
        self._by_rank = sorted(self._intakes.items(), key=lambda item: self._live.rank(item[0][0]))

    def poke(self) -> None:
        """Room was freed: each pair with room pulls again, the highest class first."""
        for (klass, tenant), intake in self._by_rank:
            if self.room(klass, tenant) > 0:
                intake.poke()

    async def stop(self) -> None:
        """Stop every pull; each hands on what its open pull delivered (PullIntake.stop)."""
        starting, self._starting = list(self._starting), set()
        await asyncio.gather(*starting, return_exceptions=True)
        intakes, self._intakes, self._by_rank = list(self._intakes.values()), {}, []
        await asyncio.gather(*(intake.stop() for intake in intakes))
