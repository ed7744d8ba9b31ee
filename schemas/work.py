"""Worker ↔ broker: a worker's `Credit` on `lw.pull.<pool>`, answered by a `Batch` of `Dispatch`."""

from __future__ import annotations

import msgspec

from schemas.requests import GenerateRequest


class Credit(msgspec.Struct, omit_defaults=True, gc=False):
    """What a worker has room for right now. Sent only when `free_slots > 0`."""

    worker_id: str
    pool: str
    free_slots: int
    token_budget: int                       # KV-cache tokens it can still take
    total_slots: int
    classes: list[str] = []                 # classes it takes; empty = all
    running: dict[str, int] = {}            # slots held per class (for the class share caps)
    wait_s: float = 5.0                     # how long the broker may hold the pull open


class Dispatch(msgspec.Struct, omit_defaults=True, gc=False):
    request: GenerateRequest
    ack_subject: str                        # JetStream ack reply subject: +WPI, +ACK, +TERM
    attempt: int                            # JetStream delivery count
    priority: int = 0                       # class rank, passed to the engine (lower = sooner)
    queued_s: float = 0.0                   # time spent waiting in the broker's lanes
    max_deliver: int = 0                    # the consumer's limit: attempt == max_deliver is the last
    cache_key: str = ""                     # store the answer under this key (deterministic requests)
    cache_model: str = ""                   # ... only if the engine serving it is this model
    escalate_to: str = ""                   # cascade: low confidence on the first tokens → that pool
    cascade_window: int = 0                 # tokens the verdict waits for
    cascade_min_logprob: float = 0.0        # mean logprob below this escalates
    cache_salt: str = ""                    # the engine's prefix-cache salt: the tenant's scope
    headers: dict[str, str] = {}            # for the client's answer (x-ratelimit-*): on the first delta

    @property
    def last_attempt(self) -> bool:
        return self.max_deliver > 0 and self.attempt >= self.max_deliver


class Batch(msgspec.Struct, omit_defaults=True, gc=False):
    dispatches: list[Dispatch] = []


class Heartbeat(msgspec.Struct, omit_defaults=True, gc=False):
    """On `lw.evt.worker.<id>` every few seconds; `ready` only after model load and warm-up."""

    worker_id: str
    pool: str
    engine: str
    model: str
    ready: bool
    total_slots: int
    free_slots: int
    token_budget: int
    interval_s: float
    stopping: bool = False
