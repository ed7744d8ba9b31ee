"""Quota policy, the 429 it produces, the pure counter arithmetic behind it, and the ledger of
grants a replica holds. No I/O here:
`broker/gate/quota/__init__.py` moves these documents in and out of NATS KV with compare-and-set.

Windows are wall-clock aligned (minute `floor(t/60)`, UTC calendar month), so every broker
replica agrees on them without talking. Fixed windows allow a burst of up to 2x the rate across
a window edge; the price of one shared counter per tenant instead of a log per request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any

import msgspec
from msgspec import Meta

Limit = Annotated[int, Meta(ge=1, le=10**15)]

RATE_LIMITED = "rate_limited"  # the ErrorCode value a rate refusal travels as
INSUFFICIENT_QUOTA = "insufficient_quota"  # ... and a spent monthly budget


class QuotaPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One tenant's limits; a field left out is unlimited. Tokens count prompt + completion."""

    requests_per_min: Limit | None = None
    tokens_per_min: Limit | None = None
    max_concurrent: Limit | None = None
    monthly_tokens: Limit | None = None

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_min is None
            and self.tokens_per_min is None
            and self.max_concurrent is None
            and self.monthly_tokens is None
        )


class BadQuotaPolicy(ValueError):
    def __init__(self, tenant: str, param: str | None, reason: str) -> None:
        super().__init__(f"tenant {tenant!r} quota: {reason}")
        self.tenant = tenant
        self.param = param
        self.reason = reason


_AT = re.compile(r"at `\$\.([A-Za-z0-9_]+)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_decode_json = msgspec.json.Decoder(QuotaPolicy).decode


def parse_policy(tenant: str, raw: bytes | Mapping[str, Any]) -> QuotaPolicy:
    """A JSON document or a TOML table → `QuotaPolicy`; errors name the offending field."""
    try:
        if isinstance(raw, (bytes, bytearray, memoryview)):
            return _decode_json(raw)
        return msgspec.convert(dict(raw), QuotaPolicy)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        text = str(exc)
        match = _AT.search(text) or _UNKNOWN.search(text)
        raise BadQuotaPolicy(tenant, match.group(1) if match else None, text) from None


# -- refusals and headers -------------------------------------------------------------------
class LimitName(str, Enum):
    requests = "requests"  # requests_per_min
    tokens = "tokens"  # tokens_per_min
    concurrency = "concurrency"  # max_concurrent
    budget = "budget"  # monthly_tokens


class RateState(msgspec.Struct, frozen=True, gc=False):
    """One limit as a client sees it: the x-ratelimit-{limit,remaining,reset}-* triple."""

    limit: int
    remaining: int
    reset_s: float


class QuotaExceeded(Exception):
    """A request over one of its tenant's limits: becomes 429 at the edge (see `rate_limit_headers`)."""

    def __init__(
        self,
        tenant: str,
        limit_name: LimitName,
        limit: int,
        remaining: int,
        reset_s: float,
        message: str,
        *,
        requests: RateState | None = None,
        tokens: RateState | None = None,
    ) -> None:
        super().__init__(message)
        self.tenant = tenant
        self.limit_name = limit_name
        self.limit = limit
        self.remaining = max(0, remaining)
        self.reset_s = max(0.0, reset_s)
        self.message = message
        self.requests = requests
        self.tokens = tokens

    @property
    def code(self) -> str:
        return INSUFFICIENT_QUOTA if self.limit_name is LimitName.budget else RATE_LIMITED

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.reset_s))


@dataclass(slots=True, eq=False)
class QuotaGrant:
    """What `admit` charged, so `release` can give back the slot and correct the token estimate."""

    tenant: str
    tokens: int  # estimated tokens charged at admission
    window: int  # minute the rate lease was charged in (-1: none)
    month: int  # yyyymm the budget was charged in (-1: none)
    slot: bool  # holds a concurrency slot
    requests_state: RateState | None = None
    tokens_state: RateState | None = None
    released: bool = False


def format_reset(seconds: float) -> str:
    """OpenAI's duration style: `20ms`, `7s`, `6m0s`, `1h2m3s`."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rate_limit_headers(source: QuotaExceeded | QuotaGrant) -> dict[str, str]:
    """The `x-ratelimit-*` headers (plus `Retry-After` for a refusal) in OpenAI's names."""
    if isinstance(source, QuotaExceeded):
        requests, tokens = source.requests, source.tokens
        headers = {"Retry-After": str(source.retry_after_s)}
    else:
        requests, tokens = source.requests_state, source.tokens_state
        headers = {}
    for suffix, state in (("requests", requests), ("tokens", tokens)):
        if state is not None:
            headers[f"x-ratelimit-limit-{suffix}"] = str(state.limit)
            headers[f"x-ratelimit-remaining-{suffix}"] = str(max(0, state.remaining))
            headers[f"x-ratelimit-reset-{suffix}"] = format_reset(state.reset_s)
    return headers


# -- periods --------------------------------------------------------------------------------
def minute_of(t: float) -> int:
    return int(t // 60)


def month_of(t: float) -> int:
    d = datetime.fromtimestamp(t, UTC)
    return d.year * 100 + d.month


def seconds_to_month_end(t: float) -> float:
    d = datetime.fromtimestamp(t, UTC)
    year, month = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return datetime(year, month, 1, tzinfo=UTC).timestamp() - t


def lease_chunk(limit: int, fraction: float) -> int:
    return max(1, math.ceil(limit * fraction))


# -- shared counter documents (msgpack in KV) and their pure updates ------------------------
class RateDoc(msgspec.Struct, array_like=True, gc=False):
    """Requests and tokens leased out by all replicas in one minute window."""

    window: int
    requests: int = 0
    tokens: int = 0


class BudgetDoc(msgspec.Struct, array_like=True, gc=False):
    month: int
    tokens: int = 0


class SlotsDoc(msgspec.Struct, gc=False):
    """Concurrency slots per replica with an expiry, so a dead replica's slots come back."""

    holders: dict[str, tuple[int, float]] = {}


@dataclass(slots=True)
class Take:
    """Outcome of one lease refill: the document to write (None: nothing to write) and what we got."""

    doc: Any
    period: int = 0
    got_requests: int = 0
    got_tokens: int = 0
    left_requests: int = 0  # shared capacity left after this take
    left_tokens: int = 0
    denied: LimitName | None = None


def take_rate(
    doc: RateDoc | None,
    window: int,
    policy: QuotaPolicy,
    need_requests: int,
    need_tokens: int,
    want_requests: int,
    want_tokens: int,
) -> Take:
    """Lease requests and tokens from the window's counter: all that is needed, or nothing."""
    if doc is not None and doc.window > window:
        window = doc.window  # a replica whose clock runs ahead already opened the next window
    if doc is None or doc.window < window:
        doc = RateDoc(window)
    rpm, tpm = policy.requests_per_min, policy.tokens_per_min
    avail_r = rpm - doc.requests if rpm is not None else 0
    avail_t = tpm - doc.tokens if tpm is not None else 0
    take = Take(None, window, left_requests=avail_r, left_tokens=avail_t)
    if rpm is not None and need_requests > 0 and avail_r < need_requests:
        take.denied = LimitName.requests
    elif tpm is not None and need_tokens > 0 and avail_t < need_tokens:
        take.denied = LimitName.tokens
    if take.denied is not None:
        return take
    # max(0, ...): a window already over (a token debt was paid into it) leases out nothing.
    take.got_requests = max(0, min(avail_r, want_requests)) if rpm is not None else 0
    take.got_tokens = max(0, min(avail_t, want_tokens)) if tpm is not None else 0
    take.left_requests -= take.got_requests
    take.left_tokens -= take.got_tokens
    take.doc = RateDoc(window, doc.requests + take.got_requests, doc.tokens + take.got_tokens)
    return take


def return_rate(doc: RateDoc | None, window: int, requests: int, tokens: int) -> RateDoc | None:
    """Give back an unused lease (or pay a token debt, `tokens` < 0) if its window is still open."""
    if doc is None or doc.window != window or (requests == 0 and tokens == 0):
        return None
    return RateDoc(window, max(0, doc.requests - requests), max(0, doc.tokens - tokens))


def take_budget(doc: BudgetDoc | None, month: int, budget: int, need: int, want: int) -> Take:
    if doc is not None and doc.month > month:
        month = doc.month
    if doc is None or doc.month < month:
        doc = BudgetDoc(month)
    avail = budget - doc.tokens
    if need > 0 and avail < need:
        return Take(None, month, left_tokens=avail, denied=LimitName.budget)
    got = max(0, min(avail, want))
    return Take(BudgetDoc(month, doc.tokens + got), month, got_tokens=got, left_tokens=avail - got)


def return_budget(doc: BudgetDoc | None, month: int, tokens: int) -> BudgetDoc | None:
    if doc is None or doc.month != month or tokens == 0:
        return None
    return BudgetDoc(month, max(0, doc.tokens - tokens))


def set_slots(
    doc: SlotsDoc | None,
    replica: str,
    now: float,
    ttl_s: float,
    limit: int,
    in_use: int,
    want_spare: int,
    need_spare: int,
) -> Take:
    """Hold `in_use + spare` slots for this replica, spare as close to `want_spare` as fits;
    denied when not even `need_spare` fits. Expired holders (dead replicas) are dropped."""
    holders = {r: h for r, h in (doc.holders if doc else {}).items() if h[1] > now and r != replica}
    others = sum(n for n, _ in holders.values())
    avail = limit - others - in_use
    if need_spare > 0 and avail < need_spare:
        return Take(None, left_requests=max(0, avail), denied=LimitName.concurrency)
    spare = max(0, min(avail, want_spare))
    if in_use + spare > 0:
        holders[replica] = (in_use + spare, now + ttl_s)
    return Take(SlotsDoc(holders), got_requests=spare, left_requests=avail - spare)


class GrantLedger:
    """The grants THIS replica holds, by (tenant, request_id), until the request's end is seen.

    A request that never reports an end (its worker died, the message went to the DLQ) is
    released by `expired` once its deadline is `grace_s` past, at its estimate.
    """

    def __init__(self, grace_s: float = 60.0) -> None:
        self._grace = grace_s
        # (tenant, request_id) → (grant, until, the stream sequence of the message it charged)
        self._held: dict[tuple[str, str], tuple[QuotaGrant, float, int]] = {}

    def hold(self, tenant: str, request_id: str, grant: QuotaGrant, deadline: float, seq: int = 0) -> None:
        self._held[(tenant, request_id)] = (grant, deadline + self._grace, seq)

    def get(self, tenant: str, request_id: str) -> tuple[QuotaGrant, int] | None:
        """(the grant, the stream sequence of the message it charged)."""
        held = self._held.get((tenant, request_id))
        return (held[0], held[2]) if held else None

    def move(self, tenant: str, request_id: str, seq: int) -> None:
        """The grant now belongs to message `seq` (an escalated copy of the one it charged)."""
        grant, until, _ = self._held[(tenant, request_id)]
        self._held[(tenant, request_id)] = (grant, until, seq)

    def pop(self, tenant: str, request_id: str) -> QuotaGrant | None:
        held = self._held.pop((tenant, request_id), None)
        return held[0] if held else None

    def expired(self, now: float) -> list[QuotaGrant]:
        gone = [key for key, (_, until, _) in self._held.items() if until < now]
        return [self._held.pop(key)[0] for key in gone]

    def __len__(self) -> int:
        return len(self._held)
