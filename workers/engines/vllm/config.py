"""The `vllm` engine's configuration: the engine arguments a worker is started with, their
command-line flags, and their mapping onto vLLM's `AsyncEngineArgs` (vLLM imported lazily)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engines.vllm.media_urls import FLAG as MEDIA_DOMAINS_FLAG
from workers.engines.vllm.media_urls import MediaFetchPolicy, parse_media_domains

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "KI": 1024,
    "MI": 1024**2,
    "GI": 1024**3,
    "TI": 1024**4,
}
# vLLM's own allow-list admits every host when empty; given this one alone it admits a name that
# never resolves (RFC 6761 reserves .invalid), so it too fetches no remote media by default.
NO_MEDIA_HOST = "no-remote-media.invalid"


def parse_bytes(text: str) -> int:
    """'268435456', '256MiB', '2GiB', '1.5G' → bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MiB, 2GiB)")
    unit = (match.group(2) or "").upper().removesuffix("B")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(slots=True)
class VllmConfig:
    """Engine arguments a worker is started with; mapped 1:1 onto vLLM's `AsyncEngineArgs`."""

    model: str
    served_model_name: str | None = None  # reported in Usage; default: the model dir's name
    quantization: str | None = None  # fp8, modelopt_fp4 (NVFP4), awq, ... (None: as saved)
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # None: the model's own context length
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # e.g. fp8 to double the KV tokens on a GPU
    max_num_seqs: int | None = None  # the engine's sequence slots; None: vLLM's default
    kv_cache_bytes: int | None = None  # KV cache size; on CPU this is the whole cache
    enforce_eager: bool | None = None  # None: eager on CPU (compiling costs minutes
    # there for ~1.5x), graphs + compile on a GPU
    dtype: str = "auto"  # auto on a CPU without AVX-512 bf16: float32
    seed: int | None = None
    # The OpenAI layer (vllm serve's --tool-call-parser etc.). Hermes' <tool_call>{json}</tool_call>
    # is what most open chat models emit; "required" and named tool_choice work with any parser.
    tool_call_parser: str | None = "hermes"
    enable_auto_tool_choice: bool = True  # tools without tool_choice mean "auto" in OpenAI
    tool_strict_level: str = "auto"  # auto: argument schemas enforced for strict tools;
    # parameter: for every tool
    reasoning_parser: str | None = None  # e.g. deepseek_r1, qwen3: reasoning → its own field
    chat_template: str | None = None  # a file or inline Jinja; None: the tokenizer's own
    extra: dict[str, Any] = field(default_factory=dict)  # any other AsyncEngineArgs field
    embedding: bool = False  # an embedding worker: vLLM's pooling runner
    convert: str = "auto"  # pooling: "embed" converts a generative model
    # (auto: native embedding models as they are,
    # generative ones converted to embed)
    allowed_media_domains: frozenset[str] = frozenset()  # hosts whose media URLs the engine
    # fetches (workers/engines/vllm/media_urls.py); empty: none
    # LoRA adapters (the models table's `adapter`), loaded on first use; None: vLLM's default.
    enable_lora: bool = False
    max_loras: int | None = None  # adapters in one batch (vLLM's GPU slots; default 1)
    max_lora_rank: int | None = None  # the largest adapter rank served (default 16)
    max_cpu_loras: int | None = None  # adapters kept in host memory (default max_loras)

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    def media_fetch(self) -> MediaFetchPolicy:
        """What the engine may fetch for a request's media URLs."""
        return MediaFetchPolicy(
            self.allowed_media_domains, local_files=bool(self.extra.get("allowed_local_media_path"))
        )

    @staticmethod
    def configure(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("vllm engine")
        g.add_argument("--model", help="model directory (or hub id where a hub is reachable)")
        g.add_argument("--served-model-name", default=None)
        g.add_argument(
            "--quantization", default=None, help="fp8 | modelopt_fp4 (NVFP4) | awq | ... (default: as the checkpoint)"
        )
        g.add_argument("--tensor-parallel-size", type=int, default=1)
        g.add_argument("--max-model-len", type=int, default=None)
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        g.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | ...")
        g.add_argument("--max-num-seqs", type=int, default=None, help="sequence slots")
        g.add_argument(
            "--kv-cache-bytes",
            type=parse_bytes,
            default=None,
            help="KV cache size, e.g. 512MiB (on CPU: the whole cache)",
        )
        g.add_argument(
            "--enforce-eager",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="default: on for CPU, off for GPU",
        )
        g.add_argument("--dtype", default="auto")
        g.add_argument("--engine-seed", type=int, default=None)
        g.add_argument(
            "--tool-call-parser",
            default="hermes",
            help="vLLM tool parser for the model's tool-call format (default hermes)",
        )
        g.add_argument(
            "--enable-auto-tool-choice",
            action=argparse.BooleanOptionalAction,
            default=True,
            help='let the model decide to call tools ("auto")',
        )
        g.add_argument(
            "--tool-strict-level",
            default="auto",
            help="auto | function | parameter: how far vLLM constrains tool calls",
        )
        g.add_argument("--reasoning-parser", default=None, help="vLLM reasoning parser (deepseek_r1, qwen3, ...)")
        g.add_argument(
            "--chat-template", default=None, help="chat template file or inline Jinja (default: the tokenizer's)"
        )
        g.add_argument(
            "--embedding", action="store_true", help="serve /v1/embeddings with vLLM's pooling runner (no generation)"
        )
        g.add_argument(
            "--convert",
            choices=("auto", "embed"),
            default="auto",
            help="with --embedding: embed converts a generative checkpoint into an "
            "embedding model (default auto: vLLM decides from the architecture)",
        )
        g.add_argument(
            MEDIA_DOMAINS_FLAG,
            type=parse_media_domains,
            default=frozenset(),
            metavar="HOST,HOST",
            help="hosts whose image/audio/video URLs the engine "
            "may fetch, matched exactly (example.com admits no subdomain); default "
            "none: only data: URLs",
        )
        g.add_argument(
            "--enable-lora",
            action="store_true",
            help="serve LoRA adapters (a models-table model's `adapter`), loaded on first use",
        )
        g.add_argument(
            "--max-loras", type=int, default=None, help="with --enable-lora: adapters in one batch (default vLLM's, 1)"
        )
        g.add_argument(
            "--max-lora-rank",
            type=int,
            default=None,
            help="with --enable-lora: the largest adapter rank (default vLLM's, 16)",
        )
        g.add_argument(
            "--max-cpu-loras",
            type=int,
            default=None,
            help="with --enable-lora: adapters kept in host memory (default --max-loras)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VllmConfig:
        if not args.model:
            raise ValueError("--model is required for the vllm engine")
        lora_sizes = [
            f"--{n.replace('_', '-')}"
            for n in ("max_loras", "max_lora_rank", "max_cpu_loras")
            if getattr(args, n, None) is not None
        ]
        if lora_sizes and not getattr(args, "enable_lora", False):
            raise ValueError(f"{', '.join(lora_sizes)} without --enable-lora: add it, or drop them")
        return cls(
            model=args.model,
            served_model_name=args.served_model_name,
            quantization=args.quantization,
            tensor_parallel_size=args.tensor_parallel_size,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_dtype=args.kv_cache_dtype,
            max_num_seqs=args.max_num_seqs,
            kv_cache_bytes=args.kv_cache_bytes,
            enforce_eager=args.enforce_eager,
            dtype=args.dtype,
            seed=args.engine_seed,
            tool_call_parser=args.tool_call_parser or None,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            tool_strict_level=args.tool_strict_level,
            reasoning_parser=args.reasoning_parser,
            chat_template=args.chat_template,
            embedding=getattr(args, "embedding", False),
            convert=getattr(args, "convert", "auto"),
            allowed_media_domains=getattr(args, "allowed_media_domains", frozenset()),
            enable_lora=getattr(args, "enable_lora", False),
            max_loras=getattr(args, "max_loras", None),
            max_lora_rank=getattr(args, "max_lora_rank", None),
            max_cpu_loras=getattr(args, "max_cpu_loras", None),
        )

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        eager, dtype = self.enforce_eager, self.dtype
        if eager is None or dtype == "auto":
            from vllm.platforms import current_platform

            on_cpu = current_platform.is_cpu()
            if eager is None:
                eager = on_cpu
            if dtype == "auto" and on_cpu and not _cpu_has_bf16():
                # bf16 weights then miss oneDNN and run ~3x slower than fp32 (measured here).
                dtype = "float32"
        kwargs: dict[str, Any] = {
            "model": self.model,
            "served_model_name": [self.name],
            "quantization": self.quantization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "enforce_eager": eager,
            "dtype": dtype,
            "scheduling_policy": "priority",  # the broker's class → EngineRequest.priority
            "disable_log_stats": True,  # no periodic log lines; our probe still gets stats
            "enable_log_requests": False,  # prompts may hold PII: never log them
            # Defence in depth: the engine refuses other hosts before vLLM sees a request.
            "allowed_media_domains": sorted(self.allowed_media_domains) or [NO_MEDIA_HOST],
        }
        if self.embedding:
            kwargs.update(runner="pooling", convert=self.convert)
        elif self.reasoning_parser:
            # Structured outputs must know where reasoning ends to constrain only the answer.
            kwargs["reasoning_parser"] = self.reasoning_parser
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if self.enable_lora:
            kwargs["enable_lora"] = True
            lora = {
                "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank,
                "max_cpu_loras": self.max_cpu_loras,
            }
            kwargs.update((k, v) for k, v in lora.items() if v is not None)
        kwargs.update(self.extra)
        return AsyncEngineArgs(**kwargs)


def _cpu_has_bf16() -> bool:
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)  # what vLLM's CPU path uses
    return bool(probe and probe())
