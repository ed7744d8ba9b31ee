"""Error codes that cross process boundaries. The HTTP status for each lives at the edge only."""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    invalid_request = "invalid_request"
    duplicate_request = "duplicate_request"  # same request id within the dedup window: generated once
    unknown_model = "unknown_model"
    unknown_class = "unknown_class"
    class_not_allowed = "class_not_allowed"  # the tenant's document does not list the subject's class
    unknown_tenant = "unknown_tenant"  # no tenant document: a direct publisher the operator removed
    permission_denied = "permission_denied"  # the NATS user may not publish there (another tenant's subject)
    payload_too_large = "payload_too_large"
    context_length_exceeded = "context_length_exceeded"  # the prompt cannot fit the model's context
    queue_full = "queue_full"  # this tenant's backlog in this class is at its cap
    rate_limited = "rate_limited"  # over the tenant's requests/tokens per minute or concurrency
    insufficient_quota = "insufficient_quota"  # the tenant's monthly token budget is spent
    storage_quota_exceeded = "storage_quota_exceeded"  # keeping this would take the tenant past its storage quota
    pii_blocked = "pii_blocked"  # the tenant's policy blocks an entity type found in the input
    pii_unavailable = "pii_unavailable"  # PII analysis failed and the policy fails closed
    pii_too_large = "pii_too_large"  # more text than the broker's PII stage analyses for one request
    overloaded = "overloaded"  # the whole system is full
    no_worker = "no_worker"  # no ready worker serves the pool
    unavailable = "unavailable"  # the edge lost NATS: nothing can be accepted or answered now
    deadline_exceeded = "deadline_exceeded"
    cancelled = "cancelled"
    slow_reader = "slow_reader"  # the client stopped reading its stream: the edge ended it
    worker_lost = "worker_lost"  # the worker died after tokens reached the client
    engine_error = "engine_error"
    internal_error = "internal_error"


# Refusals that say "not now" rather than "not this request": work no client waits on (a batch's
# line, a background response taken over) is tried again until its deadline.
PASSING = frozenset(
    {
        ErrorCode.queue_full,
        ErrorCode.rate_limited,
        ErrorCode.overloaded,
        ErrorCode.no_worker,
        ErrorCode.unavailable,
        ErrorCode.worker_lost,
        ErrorCode.pii_unavailable,
        ErrorCode.slow_reader,
    }
)
