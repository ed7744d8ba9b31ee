"""What the scheduler holds per worker pool: the lanes of waiting requests and the worker pulls
parked until work comes. `broker/scheduler/schedule.py` moves them; `sweep.py` keeps them fresh."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.affinity import PrefixIndex
from broker.balance import Loads
from broker.headroom import Bursts
from broker.lanes import Lanes
from broker.room import class_cap
from broker.running import Running
from core.policy.classes import ClassPolicy
from core.routing.rules import RuleSet
from schemas.requests import GenerateRequest
from schemas.work import Credit


class Acks(Protocol):
    """What the scheduler does to a waiting request's JetStream message: nats-py's `Msg`, or an
    `AckHandle` holding only its ack subject (a request another broker consumed)."""

    @property
    def reply(self) -> str: ...

    async def in_progress(self) -> None: ...

    async def term(self) -> None: ...

    async def nak(self) -> None: ...


@dataclass(slots=True)
class Held:
    """A waiting request and the JetStream message that stores it."""

    ack: Acks
    request: GenerateRequest
    attempt: int
    pool: str
    last_touch: float  # monotonic time of the last in-progress ack
    cache_key: str = ""
    cache_model: str = ""
    escalate_to: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    origin: str = ""  # the broker whose gate admitted it: told when it settles
    output_pii: str = ""  # the tenant's PII policy (JSON), for the worker to redact the answer
    adapter: str = ""  # its model's LoRA adapter (path)

    def cascade(self, rules: RuleSet | None) -> dict[str, Any]:
        """Dispatch fields for a request its rule may escalate: the verdict settings."""
        if not self.escalate_to or rules is None:
            return {}
        c = rules.cascade
        return {"escalate_to": self.escalate_to, "cascade_window": c.window, "cascade_min_logprob": c.min_mean_logprob}


@dataclass(slots=True)
class ParkedPull:
    credit: Credit
    reply: str
    until: float


@dataclass
class Pool:
    lanes: Lanes
    parked: list[ParkedPull] = field(default_factory=list)
    index: PrefixIndex = field(default_factory=PrefixIndex)  # which worker holds which prefix
    running: Running = field(default_factory=Running)  # dispatched and not ended, by worker
    loads: Loads = field(default_factory=Loads)  # workers just sent a batch (the balance)
    bursts: Bursts = field(default_factory=Bursts)  # the top class's recent most, by worker

    def heard(self, credit: Credit, now: float) -> None:
        """A worker's pull: what it holds (its prefixes, its adapters, its top-class slots)."""
        self.index.heard(credit.worker_id, credit.kv_tokens, now, credit.adapters)
        if (top := self.lanes.top) is not None:
            self.bursts.heard(credit.worker_id, credit.running.get(top.name, 0), now)

    def cap(self, now: float) -> Callable[[ClassPolicy, Credit], int]:
        """A class's slots at a credit's worker: its share, less its top class's bursts there."""
        top = self.lanes.top
        rank = top.rank if top else None
        return lambda policy, c: class_cap(policy, c.total_slots, self.bursts.reserve(c.worker_id, now), rank)
