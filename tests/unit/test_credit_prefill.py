"""A worker's credit reports its engine's step size and, per class, the prompt tokens it has
accepted that the engine has not started: what the broker's prefill caps read."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from schemas.requests import GenerateRequest
from schemas.work import Dispatch
from tests.requests import chat
from workers.config import WorkerConfig
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.metrics import WorkerMetrics
from workers.pulling import Puller


@dataclass
class Active:
    dispatch: Dispatch
    first_token_at: float | None


def accepted(rid: str, klass: str, chars: int, started: bool) -> Active:
    request = GenerateRequest(request_id=rid, tenant="acme", klass=klass, model="m", reply_to="lw.tok.acme.e",
                              created_at=0.0, deadline=1.0, chat=chat("x" * chars, model="m"))
    return Active(Dispatch(request, "ack", 1), 1.0 if started else None)


def test_the_credit_counts_unstarted_prompt_tokens_per_class_and_the_step_size():
    engine = SimEngine(PROFILES["llama-8b-h100"], max_num_batched_tokens=4096)
    running = {i: a for i, a in enumerate([
        accepted("b1", "batch", 6144, started=False),
        accepted("b2", "batch", 6144, started=True),     # its first token came: prefilled
        accepted("b3", "batch", 400, started=False),
        accepted("c1", "interactive", 800, started=False),
    ])}
    puller = Puller(None, "lw.pull.sim", WorkerConfig(pool="sim", worker_id="w1"), engine,  # type: ignore[arg-type]
                    WorkerMetrics(), running, lambda batch: None, asyncio.Event(), asyncio.Event())
    credit = puller.credit()
    assert credit is not None
    assert credit.step_tokens == 4096
    assert credit.prefill == {"batch": (6144 + 400) // 4, "interactive": 800 // 4}   # ~4 characters a token
