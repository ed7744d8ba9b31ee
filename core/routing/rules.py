"""Routing rules: logical models (quality tiers and `auto`) → pools, chosen against live health.

Pure: no I/O. A `RuleSet` is one versioned document (stored by `core/routing/store.py`):
the pools it may use (hosted flag, $/1M tokens, saturation thresholds) and an ordered list of
rules. The first rule whose `match` fits a request names the candidate pools with weights;
`choose_pool` drops the pools that are down or saturated, picks among the rest by weight with a
hash of the request id (reproducible, and a redelivered request lands where it did before), and
when none is left spills to the hosted-API pool.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

import msgspec

from core.policy.cascade import CascadeSettings
from core.policy.refusal import Refusal
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest

TIERS = ("fast", "balanced", "quality")
AUTO = "auto"
LOGICAL_MODELS = (*TIERS, AUTO)
INTENTS = ("simple", "complex", "code")

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class PoolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    hosted: bool = False  # the hosted-API pool (engine `openai`, behind its breaker)
    cost_in_per_1m: float = 0.0  # $ per 1M prompt tokens
    cost_out_per_1m: float = 0.0  # $ per 1M completion tokens
    max_queue_depth: int = 256  # waiting requests above this: saturated
    max_ttft_p95_s: float = 1.5  # recent TTFT p95 above this: saturated (the design's page level)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.cost_in_per_1m + completion_tokens * self.cost_out_per_1m) / 1e6


class Match(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Every field set must hold; an empty match fits every request."""

    tenant: str | None = None
    klass: str | None = msgspec.field(default=None, name="class")
    model: str | None = None
    intent: str | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None

    @property
    def catch_all(self) -> bool:
        """Fits every request for its model (or all models): no tenant, class, intent or length."""
        return (
            self.tenant is None
            and self.klass is None
            and self.intent is None
            and self.min_prompt_tokens is None
            and self.max_prompt_tokens is None
        )


class Rule(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    rule_id: str
    pools: dict[str, float]  # pool → weight (> 0)
    match: Match = Match()
    escalate_to: str | None = None  # cascade: low confidence from `pools` → this pool
    spill: bool = True  # may spill to the hosted pool (False: data must stay in-house)


class GateRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the eval gate saw when this version was stored."""

    candidate_quality: float | None = None  # None: not measured (first rule set, or forced without)
    baseline_quality: float | None = None
    candidate_cost: float | None = None  # $ per 1k golden requests
    baseline_cost: float | None = None
    forced_reason: str | None = None  # set when quality fell below baseline - 1 and it was forced
    message: str = ""  # the gate's verdict, as the operator saw it


class RuleSet(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    pools: dict[str, PoolSpec]
    rules: list[Rule]
    models: list[str] = msgspec.field(default_factory=lambda: list(LOGICAL_MODELS))
    cascade: CascadeSettings = CascadeSettings()
    version: int = 0  # assigned by the store: 1, 2, 3, ...
    author: str = ""
    reason: str = ""
    created_at: float = 0.0  # unix seconds, assigned by the store
    rollback_of: int | None = None  # this version restores that one
    gate: GateRecord | None = None

    def serves(self, model: str) -> bool:
        return model in self.models

    def needs_intent(self, model: str) -> bool:
        """Whether routing this model looks at the intent (so the classifier runs only then)."""
        return any(r.match.intent is not None and r.match.model in (None, model) for r in self.rules)

    @property
    def hosted_pools(self) -> list[str]:
        return sorted(name for name, spec in self.pools.items() if spec.hosted)


class RuleSetError(ValueError):
    """A rule set that cannot apply; `field` is the path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# -- validation -----------------------------------------------------------------------------------


def validate(rs: RuleSet) -> RuleSet:
    """Every check msgspec's types cannot express; raises RuleSetError naming the field."""
    if not rs.pools:
        raise RuleSetError("pools", "declare at least one pool")
    for name, spec in rs.pools.items():
        where = f"pools.{name}"
        if not _TOKEN.match(name):
            raise RuleSetError(where, "pool names are letters, digits, '_' or '-' (1-64)")
        for attr in ("cost_in_per_1m", "cost_out_per_1m", "max_ttft_p95_s"):
            value = getattr(spec, attr)
            if not math.isfinite(value) or value < 0:
                raise RuleSetError(f"{where}.{attr}", "must be a finite number >= 0")
        if spec.max_queue_depth < 0:
            raise RuleSetError(f"{where}.max_queue_depth", "must be >= 0")
    if not rs.models:
        raise RuleSetError("models", "name at least one logical model")
    for i, model in enumerate(rs.models):
        if not model or len(model) > 128 or model in rs.models[:i]:
            raise RuleSetError(f"models[{i}]", f"{model!r} is empty, too long or listed twice")
    if not rs.rules:
        raise RuleSetError("rules", "at least one rule is needed")
    seen: set[str] = set()
    for i, rule in enumerate(rs.rules):
        _validate_rule(rs, i, rule, seen)
    for model in rs.models:
        if not any(r.match.catch_all and r.match.model in (None, model) for r in rs.rules):
            raise RuleSetError(
                "rules",
                f"no catch-all rule for model {model!r}: some requests "
                "would match no rule (add one matching only the model)",
            )
    if rs.version < 0:
        raise RuleSetError("version", "must be >= 0")
    for attr in ("author", "reason"):
        if len(getattr(rs, attr)) > 500:
            raise RuleSetError(attr, "at most 500 characters")
    return rs


def _validate_rule(rs: RuleSet, i: int, rule: Rule, seen: set[str]) -> None:
    where = f"rules[{i}]"
    if not _TOKEN.match(rule.rule_id):
        raise RuleSetError(f"{where}.rule_id", "letters, digits, '_' or '-' (1-64)")
    if rule.rule_id in seen:
        raise RuleSetError(f"{where}.rule_id", f"duplicate rule id {rule.rule_id!r}")
    seen.add(rule.rule_id)
    if not rule.pools:
        raise RuleSetError(f"{where}.pools", "a rule needs at least one pool")
    for pool, weight in rule.pools.items():
        if pool not in rs.pools:
            raise RuleSetError(f"{where}.pools.{pool}", f"unknown pool {pool!r} (declared: {sorted(rs.pools)})")
        if not math.isfinite(weight) or weight <= 0:
            raise RuleSetError(f"{where}.pools.{pool}", f"weight must be > 0, got {weight}")
    if rule.escalate_to is not None and rule.escalate_to not in rs.pools:
        raise RuleSetError(f"{where}.escalate_to", f"unknown pool {rule.escalate_to!r}")
    m = rule.match
    if m.model is not None and m.model not in rs.models:
        raise RuleSetError(f"{where}.match.model", f"{m.model!r} is not one of models {rs.models}")
    if m.intent is not None and m.intent not in INTENTS:
        raise RuleSetError(f"{where}.match.intent", f"{m.intent!r} is not one of {list(INTENTS)}")
    for attr in ("min_prompt_tokens", "max_prompt_tokens"):
        value = getattr(m, attr)
        if value is not None and value < 0:
            raise RuleSetError(f"{where}.match.{attr}", "must be >= 0")
    if (
        m.min_prompt_tokens is not None
        and m.max_prompt_tokens is not None
        and m.min_prompt_tokens > m.max_prompt_tokens
    ):
        raise RuleSetError(f"{where}.match.min_prompt_tokens", "is above max_prompt_tokens")


_decoder = msgspec.json.Decoder(RuleSet)
_encoder = msgspec.json.Encoder()
_AT = re.compile(r" - at `\$\.?(.*)`$")


def decode(document: bytes) -> RuleSet:
    """JSON → a validated RuleSet; a type error names its field the same way validation does."""
    try:
        rs = _decoder.decode(document)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _AT.search(text)
        raise RuleSetError((m.group(1) if m else "") or "$", _AT.sub("", text)) from None
    except msgspec.DecodeError as exc:
        raise RuleSetError("$", f"not valid JSON: {exc}") from None
    return validate(rs)


def encode(rs: RuleSet) -> bytes:
    return _encoder.encode(rs)


# -- the decision ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Features:
    request_id: str
    tenant: str
    klass: str
    model: str
    prompt_tokens: int
    intent: str | None = None


def features_of(request: GenerateRequest, intent: str | None = None) -> Features:
    return Features(
        request.request_id, request.tenant, request.klass, request.model, request.estimated_prompt_tokens(), intent
    )


@dataclass(frozen=True, slots=True)
class PoolHealth:
    ready_workers: int
    queue_depth: int = 0
    ttft_p95_s: float | None = None  # None: no recent first tokens measured
    free_slots: int | None = None  # None: unknown; 0 on a hosted pool = breaker open or full


class Reason(str, Enum):
    """Bounded: also a metrics label."""

    WEIGHTED = "weighted"  # by weight among the rule's healthy pools
    SPILL_SATURATED = "spill_saturated"  # rule's pools live but saturated → hosted
    SPILL_DOWN = "spill_down"  # no rule pool has a ready worker → hosted
    OVERFLOW = "overflow"  # hosted unavailable too: least-loaded live rule pool
    ESCALATED = "escalated"  # the cascade sent it on from the small pool


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str
    rule_id: str
    reason: Reason
    escalate_to: str | None = None

    @property
    def spilled(self) -> bool:
        return self.reason in (Reason.SPILL_SATURATED, Reason.SPILL_DOWN)


def matches(m: Match, f: Features) -> bool:
    return (
        (m.tenant is None or m.tenant == f.tenant)
        and (m.klass is None or m.klass == f.klass)
        and (m.model is None or m.model == f.model)
        and (m.intent is None or m.intent == f.intent)
        and (m.min_prompt_tokens is None or f.prompt_tokens >= m.min_prompt_tokens)
        and (m.max_prompt_tokens is None or f.prompt_tokens <= m.max_prompt_tokens)
    )


def first_rule(f: Features, rs: RuleSet) -> Rule:
    for rule in rs.rules:
        if matches(rule.match, f):
            return rule
    raise Refusal(ErrorCode.unknown_model, f"no routing rule serves model {f.model!r}", "model")


def saturated(spec: PoolSpec, h: PoolHealth) -> bool:
    return (
        h.queue_depth > spec.max_queue_depth
        or (h.ttft_p95_s is not None and h.ttft_p95_s > spec.max_ttft_p95_s)
        or (spec.hosted and h.free_slots == 0)
    )


def _live(pool: str, health: Mapping[str, PoolHealth]) -> bool:
    h = health.get(pool)
    return h is not None and h.ready_workers > 0


def healthy_weights(rule: Rule, rs: RuleSet, health: Mapping[str, PoolHealth]) -> dict[str, float]:
    return {p: w for p, w in sorted(rule.pools.items()) if _live(p, health) and not saturated(rs.pools[p], health[p])}


def unit_hash(*parts: str) -> float:
    """A stable uniform number in [0, 1): the same request id always draws the same pool."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def pick_weighted(weights: dict[str, float], draw: float) -> str:  # a dict: ordered, reversible
    total = sum(weights.values())
    acc = 0.0
    for pool, weight in weights.items():
        acc += weight / total
        if draw < acc:
            return pool
    return next(reversed(weights))  # float rounding at draw ≈ 1


def choose_pool(f: Features, rs: RuleSet, health: Mapping[str, PoolHealth]) -> Decision:
    """The pool for one request. Raises `Refusal(no_worker)` when no pool can take it at all."""
    rule = first_rule(f, rs)
    healthy = healthy_weights(rule, rs, health)
    if healthy:
        pool = pick_weighted(healthy, unit_hash(rule.rule_id, f.request_id))
        return Decision(pool, rule.rule_id, Reason.WEIGHTED, _escalation(rule, pool, rs, health))
    live = [p for p in sorted(rule.pools) if _live(p, health)]
    if rule.spill:
        hosted = [
            p
            for p in rs.hosted_pools
            if p not in rule.pools and _live(p, health) and not saturated(rs.pools[p], health[p])
        ]
        if hosted:
            # The cheapest hosted pool; the spill is already the expensive path.
            pool = min(hosted, key=lambda p: (rs.pools[p].cost_out_per_1m, p))
            reason = Reason.SPILL_SATURATED if live else Reason.SPILL_DOWN
            return Decision(pool, rule.rule_id, reason)
    if live:
        # Everything is saturated and nothing can take the spill: queue where the wait is shortest
        # rather than refuse (the lanes still bound the backlog and expire stale requests).
        pool = min(live, key=lambda p: (health[p].queue_depth / health[p].ready_workers, p))
        return Decision(pool, rule.rule_id, Reason.OVERFLOW, _escalation(rule, pool, rs, health))
    raise Refusal(ErrorCode.no_worker, f"no ready worker in any pool for rule {rule.rule_id!r}")


def decide_request(
    request: GenerateRequest, rs: RuleSet, health: Mapping[str, PoolHealth], intent_of: Callable[[GenerateRequest], str]
) -> Decision:
    """The gate's route stage for a model this rule set serves; the classifier (`intent_of`)
    runs only when some rule for the model looks at the intent."""
    intent = intent_of(request) if rs.needs_intent(request.model) else None
    return choose_pool(features_of(request, intent), rs, health)


def escalated_decision(
    request: GenerateRequest, rs: RuleSet, health: Mapping[str, PoolHealth], intent_of: Callable[[GenerateRequest], str]
) -> Decision:
    """For a request the small pool gave back with low confidence: its rule's `escalate_to`
    pool when that is live (it may have gone down since), else the normal decision."""
    intent = intent_of(request) if rs.needs_intent(request.model) else None
    f = features_of(request, intent)
    rule = first_rule(f, rs)
    target = rule.escalate_to
    if target is not None and _live(target, health):
        return Decision(target, rule.rule_id, Reason.ESCALATED)
    return choose_pool(f, rs, health)


def _escalation(rule: Rule, pool: str, rs: RuleSet, health: Mapping[str, PoolHealth]) -> str | None:
    """Where a low-confidence answer goes; None (keep the small answer) while that pool is down
    or saturated: escalating into a full pool would trade a weaker answer for a late one."""
    target = rule.escalate_to
    if target is None or target == pool or not _live(target, health) or saturated(rs.pools[target], health[target]):
        return None
    return target


def route_distribution(f: Features, rs: RuleSet) -> tuple[Rule, dict[str, float]]:
    """The share of requests like `f` each pool gets when every pool is healthy: what the eval
    gate scores a rule set by (expected quality and cost rather than one hash draw)."""
    rule = first_rule(f, rs)
    total = sum(rule.pools.values())
    return rule, {p: w / total for p, w in sorted(rule.pools.items())}


def all_healthy(rs: RuleSet) -> dict[str, PoolHealth]:
    return {pool: PoolHealth(ready_workers=1) for pool in rs.pools}
