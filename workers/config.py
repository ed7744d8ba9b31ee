"""A worker's settings: its pool, what it takes, and the intervals of its loops."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field

from core.connect import NatsSettings


@dataclass(frozen=True)
class WorkerConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    pool: str = "default"
    worker_id: str = ""
    classes: tuple[str, ...] = ()  # empty: every class
    pull_wait_s: float = 5.0
    heartbeat_s: float = 2.0
    in_progress_s: float = 5.0  # must stay well under the consumer's ack_wait
    drain_s: float = 30.0  # on SIGTERM, let running requests finish this long
    # At most one flush per interval: a real engine step (≥ 5 ms on a GPU) is always longer, so
    # this never delays a token there, but an engine that steps faster (the zero-delay sim, or
    # tiny models) has its steps coalesced instead of costing one NATS message per step.
    frame_interval_s: float = 0.002

    def with_id(self) -> WorkerConfig:
        if self.worker_id:
            return self
        wid = f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}"
        return WorkerConfig(**{**self.__dict__, "worker_id": wid})
