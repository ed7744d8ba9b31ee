"""Worker ↔ broker: a worker's `Credit` on `lw.pull.<pool>`, answered by a `Batch` of `Dispatch`."""

from __future__ import annotations

import msgspec

from schemas.requests import GenerateRequest


class Credit(msgspec.Struct, omit_defaults=True, gc=False):
    """What a worker has room for right now. Sent only when `free_slots > 0`."""

    worker_id: str
    pool: str
    free_slots: int
    token_budget: int  # KV-cache tokens it can still take
    total_slots: int
    classes: list[str] = []  # classes it takes; empty = all
    running: dict[str, int] = {}  # slots held per class (for the class share caps)
    wait_s: float = 5.0  # how long the broker may hold the pull open
    step_tokens: int = 0  # the engine's tokens per step (max_num_batched_tokens); 0 = unknown
    prefill: dict[str, int] = {}  # prompt tokens accepted, not yet started, per class
    kv_tokens: int = 0  # the engine's whole KV cache (prefix affinity); 0 = unknown
    adapters: list[str] = []  # LoRA adapters it holds loaded (their logical model names)
    # What each tenant holds here, per class (class → tenant → n): for the tenants' headroom.
    tenant_slots: dict[str, dict[str, int]] = {}  # sequence slots
    tenant_tokens: dict[str, dict[str, int]] = {}  # KV tokens (prompt estimate + max_tokens)
    tenant_prefill: dict[str, dict[str, int]] = {}  # prompt tokens not yet started (as `prefill`)


class Dispatch(msgspec.Struct, omit_defaults=True, gc=False):
    request: GenerateRequest
    ack_subject: str  # JetStream ack reply subject: +WPI, +ACK, +TERM
    attempt: int  # JetStream delivery count
    priority: int = 0  # class rank, passed to the engine (lower = sooner)
    queued_s: float = 0.0  # time spent waiting in the broker's lanes
    max_deliver: int = 0  # the consumer's limit: attempt == max_deliver is the last
    cache_key: str = ""  # store the answer under this key (deterministic requests)
    cache_model: str = ""  # ... only if the engine serving it is this model
    escalate_to: str = ""  # cascade: low confidence on the first tokens → that pool
    cascade_window: int = 0  # tokens the verdict waits for
    cascade_min_logprob: float = 0.0  # mean logprob below this escalates
    cache_salt: str = ""  # the engine's prefix-cache salt: the tenant's scope
    headers: dict[str, str] = {}  # for the client's answer (x-ratelimit-*): on the first delta
    output_pii: str = ""  # the tenant's PII policy (JSON): redact the answer with it
    adapter: str = ""  # a LoRA adapter's path, named as `request.model`

    @property
    def last_attempt(self) -> bool:
        return self.max_deliver > 0 and self.attempt >= self.max_deliver


class Batch(msgspec.Struct, omit_defaults=True, gc=False):
    dispatches: list[Dispatch] = []


class Fenced(msgspec.Struct, array_like=True, frozen=True, gc=False):
    tenant: str
    request_id: str
    attempt: int  # the delivery handed back: a later one, maybe to the same worker, is not fenced


class Fence(msgspec.Struct, gc=False):
    """Scheduler → worker on `lw.fence.<worker_id>`: it judged the worker lost and handed these
    requests back to JetStream (broker/running.py). A worker that reads this was only silent: it
    drops them without a frame, an ack or a usage record, since they go on elsewhere."""

    requests: list[Fenced]


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
    loop_lag_s: float = 0.0  # how late the worker's event loop runs: its beats are that late too
    continues: bool = False  # its engine goes on with a lost worker's stream (`Engine.continues`)


# -- gate → scheduler: one broker at a time keeps the lanes of every pool (broker/scheduler/) ----
class Admitted(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A request a broker's gate admitted, for the scheduler's lanes: a request on `lw.sched.admit`,
    answered by an `AdmitAnswer`. The admitting broker (`origin`) keeps a copy until a `Settled`
    names it. Fields are append-only (array_like)."""

    request: GenerateRequest  # as the gate passed it: redacted where the policy said so
    ack_subject: str  # the JetStream message's: the scheduler acks by it alone
    attempt: int
    pool: str
    origin: str  # the admitting broker's id
    cache_key: str = ""
    cache_model: str = ""
    escalate_to: str = ""
    headers: dict[str, str] = {}
    output_pii: str = ""  # the tenant's PII policy (JSON): the worker redacts the answer
    adapter: str = ""  # the model's LoRA adapter (its path on the workers)


class AdmitAnswer(msgspec.Struct, array_like=True, gc=False):
    taken: bool  # False: refused (the client was told); release its grant


class Settlement(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    tenant: str
    request_id: str
    release: bool = False  # refused, expired or cancelled: give back its quota grant


class BrokerBeat(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A broker's heartbeat on `lw.evt.broker.<id>` (every 2 s). The scheduler's carries the
    waiting requests per pool, so every gating broker routes on the one queue there is."""

    queue_depths: dict[str, int] = {}
    leaving: bool = False  # its last beat: stopping, count it gone at once
    pii: str = ""  # its PII stage: off | regex | ner | missing (could not start)
    ack_wait_s: float = 0.0  # the requests' ack_wait it acts on: a redelivery's latest (0: unsaid)


class Settled(msgspec.Struct, array_like=True, gc=False):
    """Scheduler → origin on `lw.sched.settled.<origin>`: these requests left the lanes (sent
    BEFORE the worker's `Batch`), so the origin drops its copies."""

    settled: list[Settlement]
