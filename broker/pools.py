"""What the broker holds per worker pool: the lanes of waiting requests and the worker pulls
parked until work comes. `dispatch.py` moves them; `sweep.py` keeps them fresh."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.msg import Msg

from broker.lanes import Lanes
from schemas.requests import GenerateRequest
from schemas.work import Credit


@dataclass(slots=True)
class Held:
    """A waiting request and the JetStream message that stores it."""

    msg: Msg
    request: GenerateRequest
    attempt: int
    pool: str
    last_touch: float       # monotonic time of the last in-progress ack
    cache_key: str = ""
    cache_model: str = ""
    escalate_to: str = ""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ParkedPull:
    credit: Credit
    reply: str
    until: float


@dataclass
class Pool:
    lanes: Lanes
    parked: list[ParkedPull] = field(default_factory=list)
