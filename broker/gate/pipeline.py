"""The admission gate, in order: validate → received once (per tenant and id) → quota → PII → route → cache.

Every entry path (the bridge and direct publishers) passes through here in the broker, before
any engine or hosted API sees a request. A stage refuses with `Refusal` (code, message, param,
headers); the dispatcher turns that into a `StreamError` and a `term` of the message.

The cache comes last: its key is built from the redacted messages (never raw PII) and the
resolved model (which routing decides), so it can only be computed once both are known. A request PII blocks can therefore never get a cached answer.

The quota grant taken here is given back when the request ends: by a refusal in a later
stage, by the worker's `Usage` record (with the real token count), or by the sweep once the
request's deadline is long past (a worker that died without a word).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from broker.gate.pii import DEFAULT_POLICY, PiiAudit, PiiBlocked, PiiGate, PiiTooLarge, PiiUnavailable
from broker.gate.quota import Quota, QuotaUnavailable
from broker.gate.route import adapter_of, route
from broker.gate.validate import check_context, check_escalated, check_tenant, validate
from broker.received import Copy, Received, Verdict
from core.cache import CachedResponse, ResponseCache
from core.policy.pii import document_fingerprint
from core.policy.pii import encode as encode_pii_policy
from core.policy.pii.stream import redacts_output
from core.policy.quota import GrantLedger, QuotaExceeded, QuotaPolicy, rate_limit_headers
from core.policy.refusal import Refusal
from core.policy.tenants import Tenant
from core.routing.rules import Decision, PoolHealth, RuleSet
from core.settings import DEFAULT_CONTEXT_TOKENS, LogicalModel, context_limit
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects

log = logging.getLogger("laneway.gate")


@dataclass(slots=True)
class Admission:
    request: GenerateRequest  # as it goes on: redacted where the policy said so
    decision: Decision
    cache_key: str | None = None
    served_model: str = ""  # the model the chosen pool runs now (part of the key)
    hit: CachedResponse | None = None
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for the client's answer
    output_pii: str = ""  # the tenant's PII policy (JSON) when the worker redacts output
    adapter: str = ""  # the model's LoRA adapter (core.settings.LogicalModel.adapter)


@dataclass(frozen=True, slots=True)
class Delivery:
    """How the request's JetStream message came: what the gate may trust beyond its payload."""

    attempt: int  # JetStream's delivery count
    stream_seq: int  # which message it is (a copy under the same id is another)
    stored_as: str | None  # its Nats-Msg-Id header
    escalated: bool = False  # on the escalation subject (workers only)


@dataclass(slots=True)
class Routing:
    """What routing needs to know, as of now."""

    models: Mapping[str, LogicalModel]
    rules: RuleSet | None
    health: Mapping[str, PoolHealth]
    pool_models: Mapping[str, str]  # pool → the real model its workers announce


class Gate:
    def __init__(
        self,
        s: Subjects,
        *,
        quota: Quota | None = None,
        pii: PiiGate | None = None,
        cache: ResponseCache | None = None,
        publish_audit: Callable[[str, PiiAudit], Awaitable[None]] | None = None,
        max_context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        rank_of: Callable[[str], int] = lambda klass: 0,
    ) -> None:
        self.s = s
        self._rank_of = rank_of  # a class's rank: its place in the PII pool's tenant queue
        self.max_context_tokens = max_context_tokens  # rule-routed models' (the table's set their own)
        self.quota = quota
        self.pii = pii
        self.pii_missing: str | None = None  # why the PII stage asked for is not running
        self.cache = cache
        self.received: Received | None = None  # request ids received, per tenant (broker/received.py)
        self.ledger = GrantLedger()
        self._publish_audit = publish_audit

    def use_pii(
        self, pii: PiiGate | None, publish_audit: Callable[[str, PiiAudit], Awaitable[None]], missing: str | None = None
    ) -> None:
        """Turn the PII stage on (None: off, or `missing` says why it could not start);
        `publish_audit(tenant, audit)` gets an audit for each request with findings, or that
        could not be analysed."""
        self.pii, self.pii_missing = pii, missing
        self._publish_audit = publish_audit

    @property
    def pii_stage(self) -> str:
        """off | regex | ner | missing: what brokers announce, and `/readyz` and `up` show."""
        if self.pii is not None:
            return self.pii.mode
        return "missing" if self.pii_missing is not None else "off"

    @property
    def pii_wanted(self) -> bool:
        """The broker was asked to handle PII (whether or not its stage runs)."""
        return self.pii_stage != "off"

    async def admit(
        self,
        request: GenerateRequest,
        klass: str,
        tenant: str,
        delivery: Delivery,
        tenant_doc: Tenant | None,
        routing: Routing,
    ) -> Admission:
        validate(request, klass, tenant, self.s)
        check_escalated(request, delivery.escalated)
        check_tenant(klass, tenant, tenant_doc)
        check_context(request, context_limit(routing.models, request.model, self.max_context_tokens))
        await self._receive(request, tenant, delivery)
        output_pii = self._output_pii(request, tenant_doc)
        headers = await self._charge(request, tenant, delivery, tenant_doc)
        try:
            request = await self._pii(request, tenant, tenant_doc)
            decision = route(request, routing.models, routing.rules, routing.health)
            admission = Admission(
                request,
                decision,
                headers=headers,
                output_pii=output_pii,
                adapter=adapter_of(request, routing.models, routing.rules),
            )
            await self._lookup(admission, tenant, routing)
            return admission
        except Refusal:
            await self.release(tenant, request.request_id, 0)
            raise

    async def _receive(self, request: GenerateRequest, tenant: str, delivery: Delivery) -> None:
        """Each request id once per tenant (the subject's: the server enforced it); raises `Copy`
        for another copy of a message received, answered by the first."""
        if self.received is None:
            return
        verdict = await self.received.claim(
            tenant, request, delivery.stream_seq, delivery.stored_as, delivery.escalated
        )
        if verdict is Verdict.COPY:
            raise Copy(tenant, request.request_id, delivery.stream_seq)
        if verdict is Verdict.DUPLICATE:
            raise Refusal(
                ErrorCode.duplicate_request, f"request_id {request.request_id!r} was already received", "request_id"
            )

    # -- quota ------------------------------------------------------------------------------
    async def _charge(
        self, request: GenerateRequest, tenant: str, delivery: Delivery, tenant_doc: Tenant | None
    ) -> dict[str, str]:
        """Charge the tenant's quotas; the `x-ratelimit-*` headers that tell where it stands."""
        if self.quota is None:
            return {}
        if (held := self.ledger.get(tenant, request.request_id)) is not None:
            grant, seq = held
            if seq != delivery.stream_seq and not delivery.escalated:
                # Another message under an id this replica holds: a copy would ride on the
                # original's charge (and orphan it). An escalated copy replaces its original.
                raise Refusal(
                    ErrorCode.duplicate_request,
                    f"request_id {request.request_id!r} is already queued or running",
                    "request_id",
                )
            self.ledger.move(tenant, request.request_id, delivery.stream_seq)
            return rate_limit_headers(grant)  # already charged (a redelivery, or escalated)
        policy = tenant_doc.quota if tenant_doc else QuotaPolicy()
        try:
            # A redelivered request was accepted long ago, and an escalated one was accepted by
            # its small pool: charge them, never refuse them now.
            grant = await self.quota.admit(
                tenant, policy, request.estimated_cost(), force=delivery.attempt > 1 or delivery.escalated
            )
        except QuotaExceeded as exc:
            raise Refusal(ErrorCode(exc.code), exc.message, None, rate_limit_headers(exc)) from None
        except QuotaUnavailable as exc:  # contended, or down where the quota fails closed
            raise Refusal(
                ErrorCode.overloaded, f"the tenant's quota could not be checked; retry later ({exc})"
            ) from None
        self.ledger.hold(tenant, request.request_id, grant, request.deadline, delivery.stream_seq)
        return rate_limit_headers(grant)

    async def release(self, tenant: str, request_id: str, tokens: int) -> None:
        """The request ended (refused, cancelled, finished): give back what it held."""
        if self.quota is None:
            return
        grant = self.ledger.pop(tenant, request_id)
        if grant is not None:
            await self.quota.release(grant, tokens)

    async def release_expired(self, now: float) -> None:
        if self.quota is None:
            return
        for grant in self.ledger.expired(now):
            await self.quota.release(grant, grant.tokens)

    # -- PII --------------------------------------------------------------------------------
    def _output_pii(self, request: GenerateRequest, tenant_doc: Tenant | None) -> str:
        """The policy the worker redacts the answer with ("" for none). Log-probabilities carry
        each generated token's text, which no redaction of the answer reaches: refused then."""
        policy = tenant_doc.pii if tenant_doc is not None else None
        if self.pii is None or policy is None or not redacts_output(policy):
            return ""  # the stage is off (--pii off), or nothing of the output is redacted
        body = request.chat or request.completion
        if body is not None and (body.logprobs or getattr(body, "top_logprobs", None)):
            raise Refusal(
                ErrorCode.invalid_request,
                "logprobs would return the answer's tokens unredacted, and this tenant's PII "
                "policy redacts model output (set its pii.output = false to get them)",
                "logprobs",
            )
        return encode_pii_policy(policy).decode()

    async def _pii(self, request: GenerateRequest, tenant: str, tenant_doc: Tenant | None) -> GenerateRequest:
        if tenant_doc is None or not tenant_doc.pii.enabled:
            return request
        if self.pii is None:
            if self.pii_missing is None:
                return request  # --pii off: the operator's decision, logged at start
            # Never fall back to serving a policy that asks for PII handling unredacted.
            raise Refusal(
                ErrorCode.pii_unavailable,
                f"this tenant's policy asks for PII handling and the PII stage is not running ({self.pii_missing})",
            )
        try:
            decision, redacted = await self.pii.inspect_request(
                tenant, tenant_doc.pii, request, rank=self._rank_of(request.klass)
            )
        except PiiUnavailable as exc:
            raise Refusal(
                ErrorCode.pii_unavailable, f"PII analysis is unavailable and this tenant's policy fails closed ({exc})"
            ) from None
        except PiiTooLarge as exc:
            raise Refusal(ErrorCode.pii_too_large, str(exc), exc.param) from None
        if (decision.findings or decision.unavailable) and self._publish_audit is not None:
            await self._publish_audit(tenant, decision.audit(request.request_id))
        try:
            decision.raise_if_blocked()
        except PiiBlocked as exc:
            raise Refusal(ErrorCode.pii_blocked, str(exc), exc.param) from None
        return redacted

    async def redacted(
        self, request: GenerateRequest, tenant: str, tenant_doc: Tenant | None
    ) -> GenerateRequest | None:
        """`request` with the tenant's PII policy applied, for a record kept after it failed (the
        DLQ): not audited again, blocked values redacted too, and an unknown tenant gets the
        default policy. None when PII is on but analysis is unavailable (even for a policy that
        fails open: a record is a later copy, nobody waits on it), or the request's text is over
        the stage's limit: keep none of it then. Only called with PII on."""
        assert self.pii is not None  # only called with PII on
        policy = tenant_doc.pii if tenant_doc is not None else DEFAULT_POLICY
        try:
            decision, redacted = await self.pii.inspect_request(tenant, policy, request)
        except (PiiUnavailable, PiiTooLarge):
            return None
        return None if decision.unavailable else redacted

    # -- cache ------------------------------------------------------------------------------
    async def _lookup(self, admission: Admission, tenant: str, routing: Routing) -> None:
        request = admission.request
        if self.cache is None or not request.body.deterministic:
            return
        served = routing.pool_models.get(admission.decision.pool, "")
        if not served:
            return  # no worker has said what it runs yet: a version-less key could go stale
        admission.served_model = served
        version = f"{admission.decision.pool}:{served}"
        if admission.output_pii:  # an answer redacted under one policy is no answer under another
            version += ":" + document_fingerprint(admission.output_pii.encode())
        admission.cache_key = self.cache.key(tenant, request.model, version, request.body, request.extra)
        admission.hit = await self.cache.lookup(admission.cache_key)
