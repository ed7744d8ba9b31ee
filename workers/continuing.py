"""A redelivered request asks the edge holding its stream whether, and from where, it goes on
(schemas/continuation.py): its last worker may have died after the client got tokens."""

from __future__ import annotations

import logging

import nats.errors
from nats.aio.client import Client

from schemas import codec
from schemas.continuation import Continuation, ContinueAsk
from schemas.subjects import Subjects
from schemas.work import Dispatch

log = logging.getLogger("laneway.worker")

# An edge answers from memory at once; one that does not (gone, or an older version) is waited
# for this long, then the request runs from its start as before continuations.
ASK_TIMEOUT_S = 2.0


class EdgeAsk:
    def __init__(self, nc: Client, s: Subjects, worker_id: str) -> None:
        self._nc = nc
        self._s = s
        self._worker_id = worker_id

    async def __call__(self, dispatch: Dispatch) -> Continuation | None:
        """The edge's answer; None when no edge answers (a client on NATS itself, a bridge gone)."""
        r = dispatch.request
        subject = self._s.cont(r.reply_to)
        if subject is None:
            return None
        ask = codec.encode(ContinueAsk(r.request_id, dispatch.attempt, self._worker_id))
        try:
            msg = await self._nc.request(subject, ask, timeout=ASK_TIMEOUT_S)
            return codec.decode_continuation(msg.data)
        except (nats.errors.Error, TimeoutError, codec.DecodeError) as exc:
            log.info(
                "no edge answered for %s (attempt %d): %r; it runs from its start", r.request_id, dispatch.attempt, exc
            )
            return None
