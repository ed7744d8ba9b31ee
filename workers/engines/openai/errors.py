"""The errors of the `openai` engine: each carries what the worker and the breaker need
(HTTP status, whether another attempt may succeed, the upstream's Retry-After)."""

from __future__ import annotations

from workers.engine import EngineError, UnsupportedRequest


class UpstreamError(EngineError):
    """The upstream failed this request. `status` is its HTTP status when it answered one;
    `partial` is True when tokens had already been yielded (the stream was cut, not retried)."""

    def __init__(
        self,
        request_id: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(request_id, message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.partial = False

    @property
    def counts_against_breaker(self) -> bool:
        return self.status is None or self.status == 429 or self.status >= 500


class UpstreamTimeout(UpstreamError):
    def __init__(self, request_id: str, phase: str, *, retryable: bool) -> None:
        super().__init__(request_id, f"upstream {phase} timeout", retryable=retryable)
        self.phase = phase  # "connect" | "first_token" | "idle" | "total"


class CircuitOpen(UpstreamError):
    def __init__(self, request_id: str, retry_after_s: float) -> None:
        super().__init__(request_id, "upstream circuit breaker is open", retry_after_s=retry_after_s)


class UpstreamRejected(UnsupportedRequest):
    """The upstream refused the request itself (400/413/422): the client's fault, not the upstream's."""

    def __init__(self, request_id: str, status: int, param: str, message: str) -> None:
        super().__init__(request_id, param, message)
        self.status = status
