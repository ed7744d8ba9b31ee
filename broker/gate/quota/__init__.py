"""Stage 2 of the gate: per-tenant quotas, enforced across broker replicas through NATS KV.

Each limit has ONE shared counter document per tenant in the `lw_quota_use` bucket
(`<tenant>.rate`, `<tenant>.budget`, `<tenant>.slots`), changed only by compare-and-set
(`kv.update(key, value, last=revision)`, re-read and retried on conflict). A replica does not
charge the shared counter per request: it *leases* a chunk (`lease_fraction` of the limit, at
least what the request needs) and admits from the local lease with no I/O until it runs dry.

- Cost: one KV write per chunk, not per request (the revision of the last write is cached, so
  an uncontended refill is a single `update`; a conflict costs a `get` and another `update`).
  The refills one admission may need (rate, budget, slots) run concurrently: an admission waits
  for at most one round-trip time, and most wait for none (nor for a lock). A tenant pushing
  past a limit is refused from the last refusal for `refusal_ttl_s`, not one read per request.
- Never over-admits requests/min or concurrency: every admitted request is covered by capacity
  taken atomically from the shared count. Tokens are charged at the estimate (prompt/4 +
  max_tokens) and corrected by `release`: a request that used MORE than estimated can push its
  window over by the difference (paid back as a debt from the same window's next lease).
- May under-admit: capacity leased by one replica is invisible to the others, at most one chunk
  per other replica, and only while that replica is busy: a lease idle for `idle_settle_s` is
  given back. Concurrency slots carry an expiry renewed every `slot_ttl_s / 3`, so a dead
  replica's slots return after `slot_ttl_s`.
- If KV fails, `fail_open` admits (availability over exactness; logged; for a second after a
  failure admissions skip the store rather than each wait for a timeout: open `Quota` on a
  JetStream context with a short timeout, e.g. `nc.jetstream(timeout=1.0)`), else it raises
  `QuotaUnavailable`. A store that answers but where every write loses to other writers
  (`QuotaContended`, after backing off) is not down: that refuses, fail_open or not.
"""

from broker.gate.quota.leases import Quota
from broker.gate.quota.store import QuotaContended, QuotaUnavailable, ensure_quota_bucket
from core.policy.quota import (
    BadQuotaPolicy,
    GrantLedger,
    LimitName,
    QuotaExceeded,
    QuotaGrant,
    QuotaPolicy,
    parse_policy,
    rate_limit_headers,
)

__all__ = [
    "BadQuotaPolicy",
    "GrantLedger",
    "LimitName",
    "Quota",
    "QuotaContended",
    "QuotaExceeded",
    "QuotaGrant",
    "QuotaPolicy",
    "QuotaUnavailable",
    "ensure_quota_bucket",
    "parse_policy",
    "rate_limit_headers",
]
