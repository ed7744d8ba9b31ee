"""What waits in the lanes: an admitted request (`Item`), the one terminal state it ends in
(`State`), admission's answers (`Admit`), what a selection hands the dispatcher, and how the
lanes hold them (a `ClassLane` of `TenantQueue`s per class). No I/O.

broker/lanes.py decides the order; the dispatcher, the running table and the sweep hold these.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from core.policy.classes import ClassPolicy


class State(Enum):
    WAITING = "waiting"
    DISPATCHED = "dispatched"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FORGOTTEN = "forgotten"


class Admit(Enum):
    OK = "ok"
    UNKNOWN_CLASS = "unknown_class"
    QUEUE_FULL = "queue_full"
    EXPIRED = "expired"
    DUPLICATE = "duplicate"


@dataclass(slots=True, eq=False)
class Item:
    request_id: str
    tenant: str
    klass: str
    cost: int  # tokens: the unit of fair share and KV budget
    deadline: float
    enqueued_at: float
    payload: Any = None  # the dispatcher's handle (JetStream message, request)
    size: int = 0  # bytes it adds to a dispatch message
    state: State = State.WAITING
    order: int = 0  # admission order; ties in EDF
    slots: int = 1  # sequence slots it takes in an engine (OpenAI's n)
    prompt: int = 0  # prompt tokens: what the engine must prefill
    prefix: tuple[int, ...] = ()  # the prompt's chained chunk hashes (broker/affinity.py)
    adapter: str = ""  # the LoRA adapter it needs loaded: its logical model's name
    # JetStream delivered it before (a lost worker's stream, a scheduler's hand-back): accepted
    # earlier and already charged, it goes first in its class (broker/lanes.py)
    redelivered: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.request_id)


@dataclass(slots=True)
class Selection:
    dispatch: list[Item] = field(default_factory=list)
    expired: list[Item] = field(default_factory=list)


@dataclass(slots=True)
class TenantQueue:
    heap: list[tuple[float, int, Item]] = field(default_factory=list)
    waiting: int = 0
    vtime: float = 0.0
    admitted_at: float = float("-inf")  # its last admission: activity for the tenant headroom


@dataclass(slots=True)
class ClassLane:
    policy: ClassPolicy
    tenants: dict[str, TenantQueue] = field(default_factory=dict)
    arrivals: deque[Item] = field(default_factory=deque)  # for the age of the oldest waiting
    redelivered: deque[Item] = field(default_factory=deque)  # served ahead of fair queuing
    waiting: int = 0
    vclock: float = 0.0

    def oldest(self) -> Item | None:
        while self.arrivals and self.arrivals[0].state is not State.WAITING:
            self.arrivals.popleft()
        return self.arrivals[0] if self.arrivals else None
