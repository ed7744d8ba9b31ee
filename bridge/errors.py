"""The one boundary where error codes become HTTP statuses and OpenAI error objects."""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from core.policy.storage_quota import StorageExceeded
from schemas.codec import encode_json
from schemas.errors import ErrorCode
from schemas.openai_out import ErrorBody, ErrorResponse

# code → (HTTP status, OpenAI error type)
_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.invalid_request: (400, "invalid_request_error"),
    ErrorCode.duplicate_request: (409, "invalid_request_error"),
    ErrorCode.unknown_class: (400, "invalid_request_error"),
    ErrorCode.class_not_allowed: (403, "permission_error"),
    ErrorCode.permission_denied: (403, "permission_error"),
    ErrorCode.unknown_tenant: (403, "permission_error"),
    ErrorCode.unknown_model: (404, "invalid_request_error"),
    ErrorCode.payload_too_large: (413, "invalid_request_error"),
    ErrorCode.context_length_exceeded: (400, "invalid_request_error"),
    ErrorCode.queue_full: (429, "rate_limit_error"),
    ErrorCode.rate_limited: (429, "rate_limit_error"),
    ErrorCode.insufficient_quota: (429, "insufficient_quota"),
    ErrorCode.storage_quota_exceeded: (403, "invalid_request_error"),  # not retried: it will not fit later either
    ErrorCode.pii_blocked: (400, "invalid_request_error"),
    ErrorCode.pii_unavailable: (503, "server_error"),
    ErrorCode.pii_too_large: (413, "invalid_request_error"),
    ErrorCode.overloaded: (503, "server_error"),
    ErrorCode.no_worker: (503, "server_error"),
    ErrorCode.unavailable: (503, "server_error"),
    ErrorCode.deadline_exceeded: (504, "timeout_error"),
    ErrorCode.cancelled: (499, "invalid_request_error"),
    ErrorCode.slow_reader: (408, "timeout_error"),
    ErrorCode.worker_lost: (502, "server_error"),
    ErrorCode.engine_error: (500, "server_error"),
    ErrorCode.internal_error: (500, "server_error"),
}

_CODE_NAMES = {
    ErrorCode.unknown_model: "model_not_found",
    ErrorCode.queue_full: "rate_limit_exceeded",
    ErrorCode.rate_limited: "rate_limit_exceeded",
}

RETRY_AFTER_S = {ErrorCode.queue_full: 1, ErrorCode.overloaded: 2, ErrorCode.no_worker: 5, ErrorCode.unavailable: 2}


class EdgeError(Exception):
    """An error to answer with; `status`/`type` may override the code's defaults (e.g. 401)."""

    def __init__(
        self,
        code: ErrorCode | None,
        message: str,
        param: str | None = None,
        *,
        status: int | None = None,
        type: str | None = None,
        code_name: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        default_status, default_type = _STATUS.get(code, (500, "server_error")) if code else (500, "server_error")
        self.code = code
        self.message = message
        self.param = param
        self.status = status or default_status
        self.type = type or default_type
        self.code_name = code_name or (_CODE_NAMES.get(code, code.value) if code else None)
        self.headers = dict(headers or {})
        if code in RETRY_AFTER_S:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_S[code]))

    def body(self) -> bytes:
        return encode_json(ErrorResponse(ErrorBody(self.message, self.type, self.param, self.code_name)))

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body(), content_type="application/json", headers=self.headers)

    def http(self) -> bytes:
        """The whole HTTP/1.1 answer, for a connection refused before aiohttp reads a request."""
        body = self.body()
        head = [
            f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers.items()),
        ]
        return "\r\n".join([*head, "", ""]).encode() + body


def from_code(
    code_value: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> EdgeError:
    try:
        code = ErrorCode(code_value)
    except ValueError:
        code = ErrorCode.internal_error
    return EdgeError(code, message, param, headers=headers)


def unauthorized(message: str) -> EdgeError:
    return EdgeError(None, message, status=401, type="authentication_error", code_name="invalid_api_key")


def body_timeout(seconds: float) -> EdgeError:
    return EdgeError(
        None,
        f"the request body did not arrive within {seconds:g} s",
        status=408,
        type="invalid_request_error",
        code_name="request_timeout",
    )


def protocol_error(status: int, exc: BaseException | None) -> EdgeError:
    """aiohttp's own answers: a request it could not parse (400), a handler that failed (500)."""
    # aiohttp's messages quote the offending bytes, which may hold a credential: name the kind only.
    if isinstance(exc, LineTooLong):
        return EdgeError(ErrorCode.invalid_request, f"a request line or header is over {exc.args[1]} bytes")
    if isinstance(exc, HttpProcessingError) and status < 500:
        return EdgeError(ErrorCode.invalid_request, f"not a valid HTTP request ({type(exc).__name__})", status=status)
    if status == 504:
        return EdgeError(ErrorCode.deadline_exceeded, "the request timed out")
    return EdgeError(ErrorCode.internal_error, "internal error", status=status)


def storage_refused(exc: StorageExceeded, param: str | None = None, remedy: str | None = None) -> EdgeError:
    """Over the tenant's storage quota: the message names the limit, its value and the holding."""
    return EdgeError(ErrorCode.storage_quota_exceeded, f"{exc}; {remedy}" if remedy else str(exc), param)


def unanalysed(what: str, param: str, instead: str) -> EdgeError:
    """Text the PII stage never sees (it would be stored as sent) from a tenant whose policy
    looks for PII: refused, never stored raw nor dropped."""
    return EdgeError(
        ErrorCode.invalid_request,
        f"{what} would be stored unredacted, and this API key's PII policy redacts; {instead}",
        param,
    )


def not_found(what: str, ident: str, param: str | None = None) -> EdgeError:
    """An object the key's tenant does not have: another tenant's reads the same as none at all."""
    return EdgeError(
        ErrorCode.invalid_request, f"No {what} found with id '{ident}'.", param, status=404, code_name="not_found"
    )
