"""Who is asking: an API key → its tenant (looked up once a request), and the ids an answer
carries (`x-request-id`; an Idempotency-Key's request id). Every route that serves a tenant
authenticates here."""

from __future__ import annotations

import hashlib
import hmac
import re

from aiohttp import web

from bridge.errors import unauthorized
from core.policy.tenants import Tenant, TenantDirectory

REQUEST_ID_HEADER = "X-Request-Id"
ANSWER_ID = web.RequestKey("answer_id", str)  # what `x-request-id` answers with
TENANT: web.RequestKey[Tenant | None] = web.RequestKey("tenant", Tenant)  # whom the key opens, or None
_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,128}$")


def answer_id(request: web.Request, generated: str) -> str:
    """What `x-request-id` answers with: the client's own `X-Request-Id` when it sent a printable
    one, else `generated` (Laneway's request id). Decided once per request."""
    if ANSWER_ID not in request:
        asked = request.headers.get(REQUEST_ID_HEADER, "")
        request[ANSWER_ID] = asked if _PRINTABLE.match(asked) else generated
    return request[ANSWER_ID]


def bearer_key(request: web.Request) -> str:
    """The key of an `Authorization: Bearer <key>` header; '' when there is none."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def tenant_of(request: web.Request, tenants: TenantDirectory) -> Tenant | None:
    """The tenant the request's key opens, looked up once a request (the body middleware asks
    before the handler does)."""
    if TENANT not in request:
        key = bearer_key(request)
        request[TENANT] = tenants.authenticate(key) if key else None
    return request[TENANT]


def authenticate(request: web.Request, tenants: TenantDirectory) -> Tenant:
    if not bearer_key(request):
        raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    tenant = tenant_of(request, tenants)
    if tenant is None:
        raise unauthorized("invalid API key")
    return tenant


MAX_IDEMPOTENCY_KEY = 255  # as the payment APIs that made the header common (Stripe's limit)


def idempotent_id(secret: str, tenant: str, key: str) -> str:
    """A client retry that carries the same Idempotency-Key maps to the same request id, so
    JetStream's dedup window stores it once: exactly one generation. An HMAC under the bridges'
    shared secret: whoever knows or guesses a tenant's key still cannot compute its request id
    (to aim a request or a cancel at it). A tenant name holds no NUL, so the message is unambiguous."""
    return hmac.new(secret.encode(), f"{tenant}\0{key}".encode(), hashlib.sha256).hexdigest()[:32]
