"""A request into the request log: published with a `Nats-Msg-Id` and confirmed by its PubAck
("accepted"), tried again under the same id while the deadline allows (stored once), and every
refusal turned into the client's error. A publish never confirmed is cancelled: it may have been
stored all the same, and work its client was told failed must not run."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from bridge import publish_errors
from bridge.config import BridgeConfig
from bridge.errors import EdgeError
from bridge.metrics import BridgeMetrics
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest
from schemas.subjects import MSG_ID_HEADER, Subjects

log = logging.getLogger("laneway.bridge")


async def publish_request(
    nc: Client,
    s: Subjects,
    config: BridgeConfig,
    metrics: BridgeMetrics,
    cancel: Callable[[str, str], Awaitable[None]],
    generate: GenerateRequest,
    payload: bytes,
) -> None:
    if not nc.is_connected:  # nats-py would buffer it and leave the client waiting
        raise EdgeError(ErrorCode.unavailable, "Laneway lost its connection to NATS; retry shortly")
    subject = s.req(generate.klass, generate.tenant)
    headers = {MSG_ID_HEADER: uuid.uuid4().hex}  # its retries keep it: stored once
    js = nc.jetstream()
    last_error = nc.last_error
    timed_out = False  # a try timed out: it may have been stored all the same
    try:
        for tries in range(1, config.publish_tries + 1):
            if tries > 1 and not nc.is_connected:
                raise EdgeError(ErrorCode.unavailable, "Laneway lost its connection to NATS; retry shortly")
            left_s = generate.deadline - time.time()
            if left_s <= 0:
                raise EdgeError(
                    ErrorCode.deadline_exceeded, "the deadline passed before the request log confirmed the request"
                )
            try:
                await js.publish(subject, payload, headers=headers, timeout=min(config.publish_timeout_s, left_s))
                break
            except nats.errors.TimeoutError:
                # The PubAck did not come back. Sending it again under the same Nats-Msg-Id
                # stores it once (and a copy stored past the stream's window is dropped at
                # the broker's intake: broker/received.py).
                timed_out = True
                if tries < config.publish_tries:
                    metrics.publish_retries.inc()
            except nats.js.errors.APIError as exc:
                code = publish_errors.refusal(exc)
                if code is ErrorCode.queue_full:
                    raise EdgeError(
                        ErrorCode.queue_full,
                        f"too many queued requests for class {generate.klass!r}; retry later",
                        headers={"x-ratelimit-limit-requests": "backlog", "x-ratelimit-remaining-requests": "0"},
                    ) from None
                if code is ErrorCode.overloaded:
                    raise EdgeError(ErrorCode.overloaded, "Laneway is at capacity; retry later") from None
                raise
            except (*publish_errors.NOT_STORED, nats.errors.ConnectionClosedError):
                raise EdgeError(ErrorCode.overloaded, "the request log is unavailable; retry later") from None
        else:
            if why := publish_errors.denied(nc, subject, last_error):  # the operator's to fix, not the client's
                log.error(
                    "the bridge's NATS user may not publish requests (its permissions, or the subject prefix): %s", why
                )
            raise EdgeError(ErrorCode.overloaded, "the request log did not confirm the request in time; retry later")
    except BaseException as exc:
        # Never confirmed, and maybe stored all the same (a try timed out, or a publish was
        # cut short: the client left, a bug): cancel it, so that work the client was told
        # failed, or left, does not run. Only a refusal says it was not stored.
        if timed_out or not isinstance(exc, (EdgeError, nats.js.errors.APIError)):
            await cancel(generate.tenant, generate.request_id)
        raise
