"""The vllm engine end to end on a CUDA GPU: runs run_vllm_gpu.py and checks what it printed.

Skipped without CUDA or without vllm. The model comes from LANEWAY_GPU_MODEL_DIR (default: the
slow suite's LANEWAY_TEST_MODEL_DIR, else .cache/models/smollm2); extra engine flags from
LANEWAY_GPU_ENGINE_ARGS (e.g. "--quantization fp8 --kv-cache-dtype fp8").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def test_vllm_engine_on_gpu() -> None:
    if not _cuda():
        pytest.skip("no CUDA GPU")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm on the GPU host)")
    model = Path(
        os.environ.get("LANEWAY_GPU_MODEL_DIR")
        or os.environ.get("LANEWAY_TEST_MODEL_DIR")
        or REPO / ".cache/models/smollm2"
    )
    if not (model / "config.json").is_file():
        pytest.skip(f"no model directory at {model} (laneway model prepare smollm2 DIR)")
    extra = shlex.split(os.environ.get("LANEWAY_GPU_ENGINE_ARGS", ""))
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "run_vllm_gpu.py"),
            "--model",
            str(model),
            "--gpu-memory-utilization",
            "0.5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=REPO,
        check=False,
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["concurrent"]["streams"] == 8
    assert report["concurrent"]["tokens"] > 0 and report["single"]["tokens"] > 0
