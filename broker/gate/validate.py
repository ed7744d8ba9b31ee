"""Stage 1: is this a well-formed request that its subject allows?"""

from __future__ import annotations

import time

from core.policy.refusal import Refusal
from core.policy.tenants import Tenant
from schemas import codec, request_checks
from schemas.checks import Invalid
from schemas.errors import ErrorCode
from schemas.request_checks import check_deadline
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects


def validate(request: GenerateRequest, subject_class: str, subject_tenant: str, s: Subjects) -> None:
    """The subject is what NATS permissions guard, so the payload must agree with it, and the
    reply subject must lie in the tenant's own inbox space: a request can never make a worker
    stream tokens to another tenant."""
    if request.tenant != subject_tenant:
        raise Refusal(ErrorCode.invalid_request, "payload tenant does not match the subject", "tenant")
    if request.klass != subject_class:
        raise Refusal(ErrorCode.invalid_request, "payload class does not match the subject", "class")
    if not request.reply_to.startswith(s.tok_tenant_prefix(subject_tenant)):
        raise Refusal(ErrorCode.invalid_request, "reply_to is outside the tenant's inbox prefix", "reply_to")
    try:
        request.validate_shape()  # the bridge's own rules (schemas/checks.py), again
        check_deadline(request, time.time())
        conflict = codec.extra_conflict(request)
    except codec.DecodeError:
        raise Refusal(ErrorCode.invalid_request, "extra is not a JSON object", "extra") from None
    except Invalid as exc:
        raise refusal(exc) from None
    if conflict is not None:
        # A direct publisher's extra may not override the typed body the gate checks, nor set
        # what Laneway owns (priority, cache salt, request id).
        raise Refusal(ErrorCode.invalid_request, f"extra may not set {conflict!r}", conflict)


def check_context(request: GenerateRequest, max_context_tokens: int) -> None:
    try:
        request_checks.check_context(request, max_context_tokens)
    except Invalid as exc:
        raise refusal(exc) from None


def refusal(exc: Invalid) -> Refusal:
    return Refusal(exc.code, exc.message, exc.param)


def check_escalated(request: GenerateRequest, escalated_subject: bool) -> None:
    """Only the escalation subject, which only workers may publish to, carries an escalated
    request (one admitted past its quota: it was charged once, by its small pool)."""
    if request.escalated != escalated_subject:
        raise Refusal(ErrorCode.invalid_request, "only a worker may mark a request escalated", "escalated")


def check_tenant(subject_class: str, subject_tenant: str, tenant_doc: Tenant | None) -> None:
    """The tenant must be one the operator configured, and the subject's class one it may use: a
    direct publisher picks the class token itself, so the bridge's own check is not enough. A
    tenant with no document (deleted while its NATS user lives on) is served nothing."""
    if tenant_doc is None:
        raise Refusal(ErrorCode.unknown_tenant, f"tenant {subject_tenant!r} is not configured")
    if not tenant_doc.may_use(subject_class):
        raise Refusal(
            ErrorCode.class_not_allowed,
            f"tenant {tenant_doc.name!r} may not use class {subject_class!r} "
            f"(allowed: {', '.join(tenant_doc.classes)})",
            "class",
        )
