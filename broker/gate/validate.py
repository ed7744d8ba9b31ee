"""Stage 1: is this a well-formed request that its subject allows?"""

from __future__ import annotations

from broker.refusal import Refusal
from broker.tenants import Tenant
from schemas import codec
from schemas.errors import ErrorCode
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
        request.validate_shape()
        conflict = codec.extra_conflict(request)
    except codec.DecodeError:
        raise Refusal(ErrorCode.invalid_request, "extra is not a JSON object", "extra") from None
    except ValueError as exc:
        raise Refusal(ErrorCode.invalid_request, str(exc), "messages") from None
    if conflict is not None:
        # A direct publisher's extra may not override the typed body the gate checks, nor set
        # what Laneway owns (priority, cache salt, request id).
        raise Refusal(ErrorCode.invalid_request, f"extra may not set {conflict!r}", conflict)


def check_class(subject_class: str, tenant_doc: Tenant | None) -> None:
    """The subject's class must be one the tenant may use: a direct publisher picks the class
    token itself, so the bridge's own check is not enough. Without a tenant document (none in
    `lw_tenants`, or not loaded yet) there is no list to enforce, and the request goes on."""
    if tenant_doc is not None and not tenant_doc.may_use(subject_class):
        raise Refusal(ErrorCode.class_not_allowed,
                      f"tenant {tenant_doc.name!r} may not use class {subject_class!r} "
                      f"(allowed: {', '.join(tenant_doc.classes)})", "class")
