"""The SIMULATED engine's LoRA adapters: a request names one (its logical model, with the path
the models table gives it), the engine holds at most `max_loras`, a step that needs one it does
not hold pays a load, and an adapter's prefix cache is its own."""

from __future__ import annotations

import msgspec

from schemas.openai import ChatBody
from workers.engine import EngineRequest
from workers.engines.sim.adapters import Adapters
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.engines.sim.scheduler import BLOCK

LONG = "You are the support agent of a parcel company; answer in two short sentences. " * 40


def test_adapters_are_held_lru_and_each_load_is_paid_once() -> None:
    adapters = Adapters(max_loras=2, load_s=0.5)
    assert adapters.activate(["a"]) == 0.5
    assert adapters.activate(["a"]) == 0.0  # held: free
    assert adapters.activate(["b", "a"]) == 0.5
    assert adapters.activate(["c"]) == 0.5  # room made by the least recent: b
    assert adapters.held() == ("a", "c") and adapters.loads == 3
    assert adapters.activate(["b"]) == 0.5


async def _ask(engine: SimEngine, rid: str, model: str, adapter: str) -> tuple[int, int]:
    body = msgspec.convert({"model": model, "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}, ChatBody)
    request = EngineRequest(rid, body, cache_salt="acme", tenant="acme", adapter=adapter)
    outs = [o async for o in engine.generate(request)]
    return outs[-1].prompt_tokens, outs[-1].cached_tokens


async def test_an_adapter_is_loaded_once_reported_and_cached_apart() -> None:
    engine = SimEngine(PROFILES["zero"], max_loras=1, lora_load_s=0.0)
    await engine.start()
    try:
        _, base = await _ask(engine, "r0", "base", "")
        assert base == 0 and engine.capacity().adapters == ()
        _, first = await _ask(engine, "r1", "support", "/adapters/support")
        assert first == 0  # the base model's blocks are not its
        assert engine.capacity().adapters == ("support",) and engine.adapters.loads == 1
        prompt, again = await _ask(engine, "r2", "support", "/adapters/support")
        assert again == (prompt - 1) // BLOCK * BLOCK and engine.adapters.loads == 1
        await _ask(engine, "r3", "billing", "/adapters/billing")  # one slot: support makes room
        assert engine.capacity().adapters == ("billing",) and engine.adapters.loads == 2
    finally:
        await engine.cleanup()


def test_a_step_serves_at_most_max_loras_adapters() -> None:
    from workers.engines.sim.scheduler import Scheduler, SchedulerConfig, Sequence

    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10_000, num_blocks=1000, max_loras=2))
    seqs = [Sequence(n, 0, n, 32, adapter=name) for n, name in enumerate(["a", "b", "c", "a", "", "c"])]
    for seq in seqs:
        s.add(seq)
    step = s.schedule()
    assert {q.adapter for q in step.scheduled} == {"a", "b", ""}  # c waits: two adapters already
    assert s.waiting() == 2
    for q in list(step.scheduled):
        if q.adapter == "b":
            s.finish(q)
    s.finish_step(step)
    assert {q.adapter for q in s.schedule().scheduled} >= {"c"}  # b's slot freed: c goes
