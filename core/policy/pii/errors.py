"""Errors of the PII gate. They carry data (entity types, field paths), never raw values.

Beside the policy (which raises `PolicyError`) rather than in the gate, so that validating a
tenant's policy does not import the gate."""

from __future__ import annotations


class PiiError(Exception):
    """Base class; `code` is the wire error code the broker puts in the `StreamError`."""

    code = "pii_error"


class PiiBlocked(PiiError):
    """The tenant's policy blocks an entity type found in the request."""

    code = "pii_blocked"

    def __init__(self, entity_types: list[str], param: str = "messages") -> None:
        self.entity_types = sorted(set(entity_types))
        self.param = param  # the request field holding them, e.g. "messages[2].content"
        super().__init__("request refused by the PII policy: it contains " + ", ".join(self.entity_types))


class PiiRefused(PiiBlocked):
    """Refused whatever the policy's actions say: a part of the request no analyser reads (an
    image, audio, a file), or text that cannot be redacted in place (two keys of one object that
    would read the same). A `PiiBlocked`, so it reaches the client as `pii_blocked` too."""

    def __init__(self, reason: str, param: str) -> None:
        self.entity_types = []
        self.param = param
        PiiError.__init__(self, f"request refused by the PII policy: {reason}")


class PiiUnavailable(PiiError):
    """Analysis failed or timed out; with `fail_open=False` (the default) the request is refused."""

    code = "pii_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"PII analysis unavailable: {reason}")


class PolicyError(PiiError, ValueError):
    """A policy document is invalid; `field` is the path of the bad field, e.g. `custom[0].patterns[1].regex`."""

    code = "invalid_pii_policy"

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
