"""Liveness: the `Heartbeat` a worker publishes every `heartbeat_s` and when pinged, carrying
its readiness and free capacity (what the bridge's readiness and the pools' health read)."""

from __future__ import annotations

from schemas.work import Heartbeat
from workers.config import WorkerConfig
from workers.engine import Engine
from workers.metrics import WorkerMetrics


def heartbeat(
    worker_id: str,
    config: WorkerConfig,
    engine: Engine,
    metrics: WorkerMetrics,
    *,
    ready: bool,
    stopping: bool,
    loop_lag_s: float = 0.0,
) -> Heartbeat:
    """This worker's state now; `ready` once the engine is warm, `stopping` once it drains."""
    breaker = getattr(engine, "breaker", None)  # the openai engine's circuit breaker
    if breaker is not None:
        metrics.breaker_state.labels(config.pool).set(int(breaker.state))
    cap = engine.capacity() if ready else None
    return Heartbeat(
        worker_id=worker_id,
        pool=config.pool,
        engine=engine.name,
        model=engine.model,
        ready=ready and not stopping,
        total_slots=cap.total_slots if cap else 0,
        free_slots=cap.free_slots if cap else 0,
        token_budget=cap.token_budget if cap else 0,
        interval_s=config.heartbeat_s,
        stopping=stopping,
        loop_lag_s=round(loop_lag_s, 3),
        continues=engine.continues,
    )
