"""Typed configuration for the broker and the bridge, and the settings file loader.

Environment variables are read only by the command line (`laneway/cli.py`), which builds these.
"""

from __future__ import annotations

import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from broker.demux import STREAM_BUFFER_BYTES, TENANT_BUFFER_BYTES
from broker.runtime.connect import NatsSettings
from broker.tenants import PUBLIC_KEYS, Tenant, with_public_keys
from broker.usage.meter import PriceBook
from schemas.requests import Token


# A model's context when its settings do not say: the docker-compose pools' --max-model-len.
DEFAULT_CONTEXT_TOKENS = 16_384
# The most text (characters) the PII stage analyses for one request; a request with more is
# refused before analysis (pii_too_large). 256 Ki: ~64K tokens, four full default contexts.
DEFAULT_PII_MAX_CHARS = 256 * 1024
ContextTokens = Annotated[int, Meta(ge=1, le=10_000_000)]


class LogicalModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One row of the models table. Defaults stay out of KV, so a process that predates a field
    (it forbids unknown ones) still reads the table."""

    pool: Token
    description: str = ""
    max_context_tokens: ContextTokens = DEFAULT_CONTEXT_TOKENS  # a longer prompt is refused at the edge


def context_limit(models: Mapping[str, LogicalModel], name: str, default: int) -> int:
    """The longest prompt for model `name`: a models-table entry's own; a rule-routed model's pool
    is chosen later, so it gets `default` (--max-context-tokens, the same for bridge and broker)."""
    model = models.get(name)
    return model.max_context_tokens if model is not None else default


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The settings file: who may call (tenants) and what they may call (logical models)."""

    tenants: dict[str, Tenant] = {}
    models: dict[str, LogicalModel] = {}
    prices: PriceBook = PriceBook()      # $/1M tokens or GPU-hour prices per pool, for Usage.cost_usd
    # Requests live at most this long unless the client asks for less (x-laneway-timeout).
    default_timeout_s: Annotated[float, Meta(gt=0, le=86400)] = 600.0


class BadSettings(ValueError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def load_serving_settings(path: Path) -> Settings:
    """The settings a bridge serves (`laneway bridge`, `laneway up`): none of their keys may be
    one of the example keys Laneway's own files print."""
    settings = load_settings(path)
    if names := with_public_keys(settings.tenants.values()):
        raise BadSettings(path, f"tenant {', '.join(names)}: the key {PUBLIC_KEYS[0]!r} is a public example; "
                                "put the SHA-256 of a real secret in api_key_sha256")
    return settings


def load_settings(path: Path) -> Settings:
    try:
        raw = tomllib.loads(path.read_text())
        for name, doc in raw.get("tenants", {}).items():
            doc.setdefault("name", name)
        settings = msgspec.convert(raw, Settings)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise BadSettings(path, str(exc)) from None
    for name, tenant in settings.tenants.items():
        if tenant.name != name:
            raise BadSettings(path, f"tenant table {name!r} names tenant {tenant.name!r}")
        if tenant.default_class not in tenant.classes:
            raise BadSettings(path, f"tenant {name!r}: default_class not in classes")
    return settings


@dataclass(frozen=True)
class StreamLimits:
    """LW_REQ limits. The per-subject cap is the per-(class, tenant) backlog: publishes beyond
    it are refused by JetStream itself (discard-new per subject), which the edge turns into 429."""

    max_age_s: float = 3600.0
    dedup_window_s: float = 120.0
    max_msgs_per_subject: int = 2048
    max_msgs: int = 1_000_000
    max_bytes: int = 4 * 1024**3
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    max_ack_pending: int = 50_000
    replicas: int = 1
    # LW_DLQ keeps a dead letter this long: long enough to look into a failure, short enough that
    # what a record holds (redacted when the PII stage is on) does not pile up.
    dlq_max_age_s: float = 7 * 86400.0


@dataclass(frozen=True)
class BrokerConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    limits: StreamLimits = field(default_factory=StreamLimits)
    max_held: int = 20_000             # requests held in the lanes (waiting) at most
    sweep_interval_s: float = 0.25     # expiry and in-progress acks for waiting requests
    quotas: bool = True                # enforce tenants' quota policies (shared counters in KV)
    cache_ttl_s: float = 3600.0        # response cache TTL; 0 turns the cache off
    pii: str = "auto"                  # off | auto | regex | ner (see broker/gate/pii_service.py)
    pii_workers: int | None = None     # PII process pool size; None: one per core
    pii_max_chars: int = DEFAULT_PII_MAX_CHARS   # a request's text the PII stage analyses at most
    lease_ttl_s: float = 3.0           # the scheduler lease: a dead holder's lapses after this
    max_context_tokens: int = DEFAULT_CONTEXT_TOKENS   # rule-routed models' longest prompt, as the bridge's


MIN_SECRET_CHARS = 32      # the bridge's idempotency secret: 128 bits as hex, at the least


@dataclass(frozen=True)
class BridgeConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    worker_stale_s: float = 15.0        # a worker silent this long no longer counts as ready
    header_timeout_s: float = 30.0      # a connection without a whole request head this long is closed
    body_timeout_s: float = 60.0        # a body not read whole by then gets 408
    max_connections: int = 10_000       # open connections at most; past it, 503 and closed
    max_streams: int = 0                # open streams at most (0: no cap); past it, 503 before storing
    max_delivery_lag_s: float = 0.5     # frames this late (smoothed): no new stream until caught up (0: off)
    # One tenant's share of this bridge (0: no cap): open streams, then bytes its slow readers may
    # hold (broker/demux.py), and how long one SSE write may wait on a client that does not read.
    tenant_max_streams: int = 5_000     # the reference's whole concurrency; past it, 429 before storing
    stream_buffer_bytes: int = STREAM_BUFFER_BYTES
    tenant_buffer_bytes: int = TENANT_BUFFER_BYTES
    write_timeout_s: float = 30.0
    max_context_tokens: int = DEFAULT_CONTEXT_TOKENS   # rule-routed models' (the table's set their own)
    # A PubAck later than this: the request is published again under the same Nats-Msg-Id (JetStream
    # stores it once), up to `publish_tries` times, before the client gets 503. The tries must fit
    # in the request stream's duplicate window (120 s), or a late try could be stored again.
    publish_timeout_s: float = 5.0
    publish_tries: int = 3
    # The HMAC key of Idempotency-Key → request id (broker/bridge/chat.py), the same on every
    # replica so that a retry to another maps to the same id. `laneway bridge` requires it; a
    # bridge built in-process (tests, benchmarks) gets a random one, never a known constant.
    idempotency_secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    def __post_init__(self) -> None:
        if self.publish_tries < 1 or self.publish_timeout_s <= 0:
            raise ValueError("the bridge publishes a request at least once, with a timeout above 0")
        if len(self.idempotency_secret) < MIN_SECRET_CHARS:
            raise ValueError(f"the idempotency secret must be at least {MIN_SECRET_CHARS} characters")
