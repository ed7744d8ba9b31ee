"""The vllm engine's LoRA flags: parsed into VllmConfig, mapped onto vLLM's AsyncEngineArgs
(when vllm is importable), and refused when sized without --enable-lora."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from workers.engines.vllm.config import VllmConfig

# AsyncEngineArgs reads the model's config: the prepared test model, where there is one.
MODEL = Path(__file__).resolve().parents[2] / ".cache/models/smollm2"


def parse(*flags: str, model: str = "m") -> VllmConfig:
    parser = argparse.ArgumentParser()
    VllmConfig.configure(parser)
    return VllmConfig.from_args(parser.parse_args(["--model", model, *flags]))


def test_lora_is_off_unless_enabled() -> None:
    config = parse()
    assert not config.enable_lora
    assert (config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (None, None, None)


def test_lora_flags_are_parsed() -> None:
    config = parse("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8")
    assert config.enable_lora
    assert (config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (4, 64, 8)


def test_lora_sizes_without_enable_lora_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--max-loras, --max-lora-rank without --enable-lora"):
        parse("--max-loras", "2", "--max-lora-rank", "32")


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not (MODEL / "config.json").is_file(),
    reason="needs vllm and the prepared model (laneway model prepare smollm2)",
)
def test_lora_flags_reach_vllms_engine_args() -> None:
    model = str(MODEL)
    args = parse("--enable-lora", "--max-loras", "2", "--max-lora-rank", "32", model=model).engine_args()
    assert (args.enable_lora, args.max_loras, args.max_lora_rank) == (True, 2, 32)
    assert args.max_cpu_loras is None  # vLLM's default: max_loras
    defaults = parse("--enable-lora", model=model).engine_args()
    assert defaults.enable_lora and defaults.max_loras == 1 and defaults.max_lora_rank == 16
    assert not parse(model=model).engine_args().enable_lora
