"""The broker process's configuration, built by `laneway broker` (and `laneway up`) from its flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.connect import NatsSettings
from core.settings import DEFAULT_CONTEXT_TOKENS
from core.topology import StreamLimits

# The most text (characters) the PII stage analyses for one request; a request with more is
# refused before analysis (pii_too_large). 256 Ki: ~64K tokens, four full default contexts.
DEFAULT_PII_MAX_CHARS = 256 * 1024


@dataclass(frozen=True)
class BrokerConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    limits: StreamLimits = field(default_factory=StreamLimits)
    max_held: int = 20_000  # requests held in the lanes (waiting) at most
    sweep_interval_s: float = 0.25  # expiry and in-progress acks for waiting requests
    quotas: bool = True  # enforce tenants' quota policies (shared counters in KV)
    cache_ttl_s: float = 3600.0  # response cache TTL; 0 turns the cache off
    pii: str = "auto"  # off | auto | regex | ner (see broker/gate/pii/service.py)
    pii_workers: int | None = None  # PII process pool size; None: one per core
    pii_max_chars: int = DEFAULT_PII_MAX_CHARS  # a request's text the PII stage analyses at most
    lease_ttl_s: float = 3.0  # the scheduler lease: a dead holder's lapses after this
    max_context_tokens: int = DEFAULT_CONTEXT_TOKENS  # rule-routed models' longest prompt, as the bridge's
    prefix_affinity: bool = True  # a pull prefers requests whose prompt prefix its worker holds
