"""The routing admin API, an aiohttp sub-application mounted at `/v1/admin`:

    GET  /v1/admin/routing            the current rule set and its version
    POST /v1/admin/routing            {"rules": RuleSet, "expected_version"?, "force_reason"?}
    POST /v1/admin/routing/rollback   {"version", "expected_version"?, "reason"?}
    GET  /v1/admin/routing/history    every version, oldest first

Admin keys are not tenant keys: only SHA-256 hashes from `LANEWAY_ADMIN_KEY_SHA256` (comma-
separated) open it, and a tenant key never does. A change is validated, scored on the golden set
by the injected evaluator, passed through the eval gate and stored with optimistic concurrency;
`change_rules` is that policy, shared with `laneway routing set`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

import msgspec
from aiohttp import web

from bridge.errors import EdgeError
from core import env
from core.routing import rules
from core.routing.eval_gate import (
    EvalOutcome,
    Evaluator,
    EvalUnavailable,
    GateVerdict,
    gate,
    gate_record,
    gate_unmeasured,
)
from core.routing.rules import RuleSet, RuleSetError
from core.routing.store import RuleStore, VersionConflict, VersionNotFound
from schemas.codec import encode_json

ADMIN_KEY_ENV = env.ADMIN_KEY_SHA256.name
_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    key_sha256: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AdminConfig:
        """The admin keys' hashes as `LANEWAY_ADMIN_KEY_SHA256` holds them: hex, comma-separated."""
        hashes = tuple(h.strip().lower() for h in text.split(",") if h.strip())
        bad = [h for h in hashes if not _HASH.match(h)]
        if bad:
            raise ValueError(f"{ADMIN_KEY_ENV}: {len(bad)} value(s) are not SHA-256 hex digests")
        return cls(hashes)

    def authenticate(self, key: str) -> str | None:
        """The matching hash (its prefix names the admin in records), or None."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        for h in self.key_sha256:
            if hmac.compare_digest(digest, h):
                return h
        return None


# -- the policy: validate → eval → gate → store ---------------------------------------------------


class GateRefused(Exception):
    def __init__(self, verdict: GateVerdict, outcome: EvalOutcome | None) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class Applied:
    stored: RuleSet
    verdict: GateVerdict
    outcome: EvalOutcome | None


async def change_rules(
    store: RuleStore,
    candidate: RuleSet,
    evaluator: Evaluator | None,
    expected_version: int | None = None,
    force_reason: str | None = None,
) -> Applied:
    rules.validate(candidate)
    current = await store.get_current()
    actual = current.version if current else 0
    if expected_version is None:
        expected_version = actual
    elif expected_version != actual:
        raise VersionConflict(expected_version, actual)  # before paying for an evaluation
    outcome: EvalOutcome | None = None
    if evaluator is None:
        verdict = gate_unmeasured(current is not None, force_reason, "no evaluator configured")
    else:
        try:
            outcome = await evaluator(candidate, current)
        except EvalUnavailable as exc:
            verdict = gate_unmeasured(current is not None, force_reason, str(exc))
        else:
            verdict = gate(
                outcome.candidate.quality, outcome.baseline.quality if outcome.baseline else None, force_reason
            )
    if not verdict.allowed:
        raise GateRefused(verdict, outcome)
    recorded = msgspec.structs.replace(candidate, gate=gate_record(outcome, verdict))
    return Applied(await store.put(recorded, expected_version), verdict, outcome)


# -- HTTP -----------------------------------------------------------------------------------------


class ChangeBody(msgspec.Struct, forbid_unknown_fields=True):
    rules: msgspec.Raw
    expected_version: int | None = None
    force_reason: str | None = None


class RollbackBody(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    expected_version: int | None = None
    reason: str = ""


_change = msgspec.json.Decoder(ChangeBody)
_rollback = msgspec.json.Decoder(RollbackBody)


def _error(
    status: int, message: str, code: str, param: str | None = None, type: str = "invalid_request_error"
) -> EdgeError:
    return EdgeError(None, message, param, status=status, type=type, code_name=code)


def _json(doc: object, status: int = 200) -> web.Response:
    return web.Response(body=encode_json(doc), status=status, content_type="application/json")


def _summary(rs: RuleSet) -> dict[str, object]:
    return {
        "version": rs.version,
        "author": rs.author,
        "reason": rs.reason,
        "created_at": rs.created_at,
        "rollback_of": rs.rollback_of,
        "gate": rs.gate,
    }


def _gate_doc(applied: Applied) -> dict[str, object]:
    v = applied.verdict
    return {
        "allowed": v.allowed,
        "forced": v.forced,
        "message": v.message,
        "candidate_quality": v.candidate_quality,
        "baseline_quality": v.baseline_quality,
        "forced_reason": v.forced_reason,
    }


class _Admin:
    def __init__(self, store: RuleStore, evaluator: Evaluator | None, config: AdminConfig) -> None:
        self.store = store
        self.evaluator = evaluator
        self.config = config

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            self._authenticate(request)
            return await handler(request)
        except EdgeError as exc:
            return exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(
                exc.status, exc.reason or "request refused", "not_found" if exc.status == 404 else "invalid_request"
            ).response()

    def _authenticate(self, request: web.Request) -> str:
        if not self.config.key_sha256:
            raise _error(
                401,
                f"the admin API is disabled: no admin key configured ({ADMIN_KEY_ENV})",
                "admin_disabled",
                type="authentication_error",
            )
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise _error(
                401,
                "missing admin key: send 'Authorization: Bearer <admin key>'",
                "invalid_api_key",
                type="authentication_error",
            )
        matched = self.config.authenticate(key.strip())
        if matched is None:
            raise _error(401, "invalid admin key", "invalid_api_key", type="authentication_error")
        return f"admin-{matched[:8]}"  # who, in records, without the key or its full hash

    async def get_current(self, request: web.Request) -> web.Response:
        current = await self.store.get_current()
        return _json({"version": current.version if current else 0, "rules": current})

    async def history(self, request: web.Request) -> web.Response:
        versions = await self.store.history()
        current = versions[-1].version if versions else 0
        return _json({"object": "list", "current": current, "data": [_summary(v) for v in versions]})

    async def change(self, request: web.Request) -> web.Response:
        body = _decode(_change, await request.read())
        try:
            candidate = rules.decode(bytes(body.rules))
        except RuleSetError as exc:
            field = "" if exc.field == "$" else f".{exc.field}"
            raise _error(400, f"invalid rules: {exc.message}", "invalid_rules", f"rules{field}") from None
        # The admin key is the identity; a name in the document is kept beside it, not instead.
        who = self._authenticate(request)
        candidate = msgspec.structs.replace(
            candidate,
            author=f"{candidate.author} ({who})" if candidate.author else who,
            version=0,
            rollback_of=None,
            gate=None,
        )
        try:
            applied = await change_rules(
                self.store, candidate, self.evaluator, body.expected_version, body.force_reason
            )
        except VersionConflict as exc:
            raise _error(409, str(exc), "version_conflict", "expected_version") from None
        except GateRefused as exc:
            raise _error(422, f"eval gate: {exc.verdict.message}", "quality_gate_failed", "rules") from None
        return _json({"version": applied.stored.version, "rules": applied.stored, "gate": _gate_doc(applied)})

    async def rollback(self, request: web.Request) -> web.Response:
        body = _decode(_rollback, await request.read())
        try:
            stored = await self.store.rollback(
                body.version, self._authenticate(request), body.reason, body.expected_version
            )
        except VersionNotFound as exc:
            raise _error(404, str(exc), "version_not_found", "version") from None
        except VersionConflict as exc:
            raise _error(409, str(exc), "version_conflict", "expected_version") from None
        return _json({"version": stored.version, "rollback_of": stored.rollback_of, "rules": stored})


def _decode(decoder: msgspec.json.Decoder, body: bytes):
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        m = re.search(r" - at `\$\.?(.*)`$", str(exc))
        raise _error(400, str(exc), "invalid_request", (m.group(1) if m else None) or None) from None
    except msgspec.DecodeError as exc:
        raise _error(400, f"the body is not valid JSON: {exc}", "invalid_request") from None


def admin_app(store: RuleStore, evaluator: Evaluator | None, config: AdminConfig) -> web.Application:
    """Mount with `app.add_subapp("/v1/admin", admin_app(...))`."""
    admin = _Admin(store, evaluator, config)
    app = web.Application(middlewares=[admin.middleware])
    app.router.add_get("/routing", admin.get_current)
    app.router.add_post("/routing", admin.change)
    app.router.add_post("/routing/rollback", admin.rollback)
    app.router.add_get("/routing/history", admin.history)
    return app
