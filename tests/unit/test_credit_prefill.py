"""A worker's credit reports its engine's step size and, per class, the prompt tokens it has
accepted that the engine has not started: what the broker's prefill caps read. And what each
tenant holds there per class: what the tenants' headroom reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from schemas.requests import GenerateRequest
from schemas.work import Credit, Dispatch
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


def accepted(
    rid: str, klass: str, chars: int, started: bool, tenant: str = "acme", model: str = "m", adapter: str = ""
) -> Active:
    request = GenerateRequest(
        request_id=rid,
        tenant=tenant,
        klass=klass,
        model=model,
        reply_to="lw.tok.acme.e",
        created_at=0.0,
        deadline=1.0,
        chat=chat("x" * chars, model=model),
    )
    return Active(Dispatch(request, "ack", 1, adapter=adapter), 1.0 if started else None)


def credit_of(engine: SimEngine, *active: Active) -> Credit:
    puller = Puller(
        None,
        "lw.pull.sim",
        WorkerConfig(pool="sim", worker_id="w1"),
        engine,  # type: ignore[arg-type]
        WorkerMetrics(),
        dict(enumerate(active)),
        lambda batch: None,
        asyncio.Event(),
        asyncio.Event(),
    )
    credit = puller.credit()
    assert credit is not None
    return credit


def test_the_credit_counts_unstarted_prompt_tokens_per_class_and_the_step_size():
    credit = credit_of(
        SimEngine(PROFILES["llama-8b-h100"], max_num_batched_tokens=4096),
        accepted("b1", "batch", 6144, started=False),
        accepted("b2", "batch", 6144, started=True),  # its first token came: prefilled
        accepted("b3", "batch", 400, started=False),
        accepted("c1", "interactive", 800, started=False),
    )
    assert credit.step_tokens == 4096
    assert credit.prefill == {"batch": (6144 + 400) // 4, "interactive": 800 // 4}  # ~4 characters a token


def test_the_credit_counts_what_each_tenant_holds_per_class():
    g1, g2 = (accepted(rid, "interactive", 6144, started=rid == "g1", tenant="globex") for rid in ("g1", "g2"))
    c1, b1 = accepted("c1", "interactive", 800, started=True), accepted("b1", "batch", 400, started=False)
    credit = credit_of(SimEngine(PROFILES["llama-8b-h100"]), g1, g2, c1, b1)
    assert credit.tenant_slots == {"interactive": {"globex": 2, "acme": 1}, "batch": {"acme": 1}}
    cost = {a.dispatch.request.request_id: a.dispatch.request.estimated_cost() for a in (g1, g2, c1, b1)}
    assert credit.tenant_tokens == {
        "interactive": {"globex": cost["g1"] + cost["g2"], "acme": cost["c1"]},
        "batch": {"acme": cost["b1"]},
    }
    # Prompts not yet through prefill, per tenant (g1 and c1 have their first token).
    assert credit.tenant_prefill == {"interactive": {"globex": 6144 // 4}, "batch": {"acme": 400 // 4}}


def test_the_credit_names_the_adapters_of_accepted_requests_before_the_engine_loads_them():
    # The pull that follows a batch is sent before the engine's next step loads the batch's
    # adapter: read without it, the broker sent that adapter's next request to another worker,
    # which loaded it too (tests/e2e/test_adapters.py, one run in a clean clone's).
    engine = SimEngine(PROFILES["llama-8b-h100"], max_loras=1)
    engine.adapters.activate(["support-billing"])  # held from an earlier step
    parcels = accepted("p1", "interactive", 40, started=False, model="support-parcels", adapter="/adapters/parcels")
    credit = credit_of(engine, parcels, accepted("c1", "interactive", 40, started=False))
    assert credit.adapters == ["support-parcels", "support-billing"]
    assert credit_of(engine).adapters == ["support-billing"]
