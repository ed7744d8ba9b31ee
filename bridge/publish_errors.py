"""Why a JetStream publish was refused, as an `ErrorCode`: one place for the bridge and the client.

The server names each refusal by `err_code` (nats-server `server/errors.json`):

- 10077 `JSStreamStoreFailedF` (503, description `{err}`): a stream limit refused the message.
  `{err}` is the store's own error, and it is the only thing that tells the limits apart: the
  filestore's `ErrMaxMsgsPerSubject` "maximum messages per subject exceeded" (our per-class
  backlog cap: `discard_new_per_subject`), `ErrMaxMsgs` "maximum messages exceeded" and
  `ErrMaxBytes` "maximum bytes exceeded" (the whole stream is full).
- 10023 `JSInsufficientResourcesErr` (503), 10047 `JSStorageResourcesExceededErr` (500),
  10028 `JSMemoryResourcesExceededErr` (500), 10002 `JSAccountResourcesExceededErr` (400): the
  server or the account has no room.

`tests/integration/test_publish_errors.py` provokes them against the real server.

A publish the connection's user may not make is not refused by JetStream at all: the server drops
it and sends an -ERR on the connection, so the publish only times out (`denied` tells).
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from schemas.errors import ErrorCode

STREAM_STORE_FAILED = 10077
RESOURCE_CODES = frozenset(
    {
        10023,  # JSInsufficientResourcesErr
        10047,  # JSStorageResourcesExceededErr
        10028,  # JSMemoryResourcesExceededErr
        10002,  # JSAccountResourcesExceededErr
    }
)
PER_SUBJECT_FULL = "maximum messages per subject exceeded"  # the filestore's ErrMaxMsgsPerSubject

# No PubAck came back, so nothing was stored (e.g. the stream is electing a leader): safe to
# retry with the same request id, the dedup window keeps it to one generation.
NOT_STORED = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)


def refusal(exc: nats.js.errors.APIError) -> ErrorCode | None:
    """`queue_full` for a full per-class backlog, `overloaded` for a full stream or server; None
    for any other API error (not a capacity refusal)."""
    if exc.err_code == STREAM_STORE_FAILED:
        if (exc.description or "").lower() == PER_SUBJECT_FULL:
            return ErrorCode.queue_full
        return ErrorCode.overloaded
    if exc.err_code in RESOURCE_CODES or exc.code == 503:
        return ErrorCode.overloaded
    return None


def denied(nc: Client, subject: str, before: Exception | None) -> str | None:
    """The server's -ERR for a publish to `subject` that this connection's user may not make, if
    one came since `before` (nats-py keeps only the last -ERR, as `last_error`); None if not."""
    error = nc.last_error
    if error is None or error is before:
        return None
    text = str(error)
    return text if f'permissions violation for publish to "{subject}"'.lower() in text.lower() else None
