"""The bridge process's configuration, built by `laneway bridge` (and `laneway up`) from its flags."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from bridge.streams.demux import RESUME_TENANT_BYTES, STREAM_BUFFER_BYTES, TENANT_BUFFER_BYTES
from core.connect import NatsSettings
from core.settings import DEFAULT_CONTEXT_TOKENS

MIN_SECRET_CHARS = 32  # the bridge's idempotency secret: 128 bits as hex, at the least


@dataclass(frozen=True)
class BridgeConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    worker_stale_s: float = 15.0  # a worker silent this long no longer counts as ready
    header_timeout_s: float = 30.0  # a connection without a whole request head this long is closed
    # A body not read whole by then gets 408 (an upload: more for each 64 KiB it delivered, bridge/files/routes.py).
    # As the head's: a connection trickling its body is held no longer than one trickling its head.
    body_timeout_s: float = 30.0
    max_connections: int = 10_000  # open connections at most; past it, 503 and closed
    max_streams: int = 0  # open streams at most (0: no cap); past it, 503 before storing
    # Where the measured stream limit starts (bridge/generate/admission.py StreamLimit; 0: not measured).
    initial_stream_limit: int = 256
    max_delivery_lag_s: float = 0.5  # frames this late (smoothed): no new stream until caught up (0: off)
    # While a higher class streams, the classes under it are admitted as far as frames arrive this
    # much later than the least lag lately (smoothed): a measured limit of their own (admission.py; 0: off).
    lower_class_lag_s: float = 0.0025
    # One tenant's share of this bridge (0: no cap): open streams, then bytes its slow readers may
    # hold (bridge/streams/demux.py), and how long one SSE write may wait on a client that does not read.
    tenant_max_streams: int = 5_000  # the reference's whole concurrency; past it, 429 before storing
    # Of a class's room in the stream limit, what one tenant may take while others want it
    # (bridge/generate/admission.py `admit`; 1.0: off): past it, 503 before storing.
    tenant_stream_share: float = 0.9
    stream_buffer_bytes: int = STREAM_BUFFER_BYTES
    tenant_buffer_bytes: int = TENANT_BUFFER_BYTES
    write_timeout_s: float = 30.0
    # How long a stream whose client left stays resumable (Last-Event-ID; bridge/resume/window.py): its
    # generation goes on meanwhile. 0: no resuming, the generation is cancelled at once.
    resume_window_s: float = 30.0
    resume_tenant_bytes: int = RESUME_TENANT_BYTES  # events one tenant's streams keep for resuming
    # A stream whose worker dies goes on on another worker at most this many times (bridge/streams/continuation.py).
    max_migrations: int = 2
    max_context_tokens: int = DEFAULT_CONTEXT_TOKENS  # rule-routed models' (the table's set their own)
    # The Files and Batch APIs: the largest upload; lines one bridge has in flight for the batches
    # it runs; how long a bridge's claim on a batch lasts unrenewed (another takes over after it).
    max_file_bytes: int = 200 * 1024 * 1024
    batch_concurrency: int = 64
    batch_lease_s: float = 15.0
    # A PubAck later than this: the request is published again under the same Nats-Msg-Id (JetStream
    # stores it once), up to `publish_tries` times, before the client gets 503. The tries must fit
    # in the request stream's duplicate window (120 s), or a late try could be stored again.
    publish_timeout_s: float = 5.0
    publish_tries: int = 3
    store_replicas: int = 1  # the stored responses bucket's replicas when this bridge creates it
    # A background response's heartbeat in the store: unrefreshed for 4 of these, it reads as failed.
    background_lease_s: float = 5.0
    # The HMAC key of Idempotency-Key → request id (bridge/generate/routes.py), the same on every
    # replica so that a retry to another maps to the same id. `laneway bridge` requires it; a
    # bridge built in-process (tests, benchmarks) gets a random one, never a known constant.
    idempotency_secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    def __post_init__(self) -> None:
        if self.resume_window_s < 0:
            raise ValueError("the resume window is a number of seconds, 0 or more")
        if self.publish_tries < 1 or self.publish_timeout_s <= 0:
            raise ValueError("the bridge publishes a request at least once, with a timeout above 0")
        if not 0 < self.tenant_stream_share <= 1:
            raise ValueError("a tenant's share of the stream limit is a fraction in (0, 1]")
        if len(self.idempotency_secret) < MIN_SECRET_CHARS:
            raise ValueError(f"the idempotency secret must be at least {MIN_SECRET_CHARS} characters")
