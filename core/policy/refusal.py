"""`Refusal`: how a policy stage says no. A leaf module (imports only the wire contract) so that
the gate's stages and the routing rules can both raise it without importing each other.

A stage returns its verdict or raises `Refusal` carrying an `ErrorCode`; the dispatcher turns
a refusal into a `StreamError` on the reply subject and a `term` of the message.
"""

from __future__ import annotations

from schemas.errors import ErrorCode


class Refusal(Exception):
    def __init__(
        self, code: ErrorCode, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}
