"""The cascade at the worker: hold a small pool's first tokens for the verdict, and hand a
low-confidence request over to the larger pool.

The decision itself is pure (`core/policy/cascade.py`); this module only builds the gate for
a dispatch that asked for one and re-publishes the request when the verdict is ESCALATE.
"""

from __future__ import annotations

import logging
import uuid

import msgspec
import nats.errors
from nats.js import JetStreamContext

from core.policy.cascade import CascadeSettings, StreamGate
from schemas import codec
from schemas.subjects import MSG_ID_HEADER, Subjects
from schemas.work import Dispatch
from workers.engine import Engine, EngineOutput
from workers.metrics import WorkerMetrics

log = logging.getLogger("laneway.worker")


def stream_gate(dispatch: Dispatch, engine: Engine) -> StreamGate[EngineOutput] | None:
    """A gate holding the first tokens until their confidence says keep or escalate; None when
    the dispatch has nowhere to escalate to or the engine gives no logprobs."""
    if not dispatch.escalate_to or not engine.supports_logprobs:
        return None
    return StreamGate(CascadeSettings(min_mean_logprob=dispatch.cascade_min_logprob, window=dispatch.cascade_window))


class Escalator:
    """Re-sends a request for the larger pool as a new JetStream message."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, metrics: WorkerMetrics, pool: str) -> None:
        self._js = js
        self._s = subjects
        self._metrics = metrics
        self._pool = pool

    async def hand_over(self, dispatch: Dispatch, score: float) -> bool:
        """True once the escalated copy is stored (so this one may be acked); False when it was
        not, and this worker should serve the request after all, on the next attempt."""
        r = dispatch.request
        escalated = msgspec.structs.replace(r, escalated=True)
        try:
            await self._js.publish(
                self._s.req_escalated(r.klass, r.tenant),
                codec.encode(escalated),
                headers={MSG_ID_HEADER: uuid.uuid4().hex},
            )  # a second escalated copy is dropped at intake
        except (nats.errors.Error, OSError) as exc:  # not stored (nats' TimeoutError is an OSError)
            log.warning("escalating %s failed (%s); retrying it", r.request_id, exc)
            return False
        self._metrics.escalations.labels(self._pool).inc()
        log.info("escalated %s to %s (mean logprob %.2f)", r.request_id, dispatch.escalate_to, score)
        return True
