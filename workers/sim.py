"""A SIMULATED GPU engine: continuous batching with a step-time model, honouring the Engine contract.

It exists so the broker can be load-tested at production concurrency on a laptop; every figure
it produces is a simulation and is labelled so. Like vLLM, each engine step admits waiting
sequences (by priority, then arrival) while slots and KV tokens last, prefills them, and decodes
one token for every running sequence; the step's duration is

    prefill_tokens × prefill_s_per_token + decode_base_s + running × decode_s_per_seq

The profiles derive their constants from published hardware figures with a roofline model:
decode is memory-bound (read the weights once per step, plus each sequence's KV cache), prefill
is compute-bound (2 × params FLOPs per token).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from broker.runtime.tasks import cancel_and_wait
from workers.engine import Capacity, Engine, EngineOutput, EngineRequest

# NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense BF16, 1,979 TFLOPS dense FP8, 80 GB.
_H100_BW, _H100_BF16, _H100_FP8, _H100_MEM = 3.35e12, 989e12, 1979e12, 80e9
_BW_EFF, _MFU = 0.7, 0.5      # achieved fractions typical of vLLM decode / prefill
_CTX = 1900                   # reference context for per-sequence KV reads: 1.5K in + 400 out


@dataclass(frozen=True)
class SimProfile:
    name: str
    prefill_s_per_token: float
    decode_base_s: float
    decode_s_per_seq: float
    max_seqs: int
    kv_tokens: int
    source: str


def _roofline(name: str, params: float, weight_bytes: float, kv_bytes_per_token: float,
              gpus: int, peak_flops: float, source: str) -> SimProfile:
    bw = _H100_BW * gpus * _BW_EFF
    return SimProfile(
        name=name,
        prefill_s_per_token=2 * params / (peak_flops * gpus * _MFU),
        decode_base_s=weight_bytes / bw,
        decode_s_per_seq=_CTX * kv_bytes_per_token / bw,
        max_seqs=256,   # vLLM's default max_num_seqs
        kv_tokens=int((_H100_MEM * gpus * 0.9 - weight_bytes) / kv_bytes_per_token),
        source=source,
    )


PROFILES: dict[str, SimProfile] = {
    # Llama-3.1-8B, BF16, 1×H100: 16 GB weights; KV 32 layers × 8 kv-heads × 128 × 2 (K,V) × 2 B = 128 KiB/token.
    "llama-8b-h100": _roofline(
        "llama-8b-h100", 8.0e9, 16.0e9, 131_072, 1, _H100_BF16,
        "H100 SXM datasheet (3.35 TB/s, 989 TFLOPS BF16); Llama-3.1-8B config; 70% bandwidth, 50% MFU"),
    # Llama-3.1-70B, FP8 weights, TP=2 on 2×H100: 70 GB weights; KV 80 layers × 8 × 128 × 2 × 2 B = 320 KiB/token.
    "llama-70b-fp8-2xh100": _roofline(
        "llama-70b-fp8-2xh100", 70.6e9, 70.6e9, 327_680, 2, _H100_FP8,
        "H100 SXM datasheet (3.35 TB/s, 1979 TFLOPS FP8) ×2 (TP=2); Llama-3.1-70B config; 70% bandwidth, 50% MFU"),
    # No GPU time at all: isolates Laneway's own overhead in benchmarks.
    "zero": SimProfile("zero", 0.0, 0.0, 0.0, 4096, 1 << 40, "no delays: overhead measurements only"),
}

_WORDS = ("Laneway ", "streams ", "simulated ", "tokens ", "from ", "a ", "modelled ", "GPU ",
          "engine ", "with ", "continuous ", "batching. ")


@dataclass(eq=False)
class _Seq:
    request: EngineRequest
    prompt_tokens: int
    reserve: int                      # KV tokens held: prompt + max_tokens (worst case)
    order: int
    produced: int = 0
    text: str = ""
    logprob: float = 0.0
    done: bool = False
    buffer: deque[EngineOutput] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None

    def push(self, out: EngineOutput) -> None:
        if self.buffer and self.buffer[-1].finish_reason is None and out.finish_reason is None:
            last = self.buffer[-1]          # the consumer lags: merge deltas, as vLLM DELTA does
            last.text += out.text
            last.token_ids.extend(out.token_ids)
            last.logprobs.extend(out.logprobs)
        else:
            self.buffer.append(out)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class SimEngine(Engine):
    name = "sim"
    supports_logprobs = True

    def __init__(self, profile: SimProfile, *, model: str = "", speed: float = 1.0,
                 max_seqs: int | None = None, kv_tokens: int | None = None) -> None:
        self.profile = profile
        self.model = model or f"sim/{profile.name}"
        self.speed = speed                  # >1 runs the same model faster (tests)
        self.max_seqs = max_seqs or profile.max_seqs
        self.kv_tokens = kv_tokens or profile.kv_tokens
        self._waiting: list[tuple[int, int, _Seq]] = []
        self._running: dict[str, _Seq] = {}
        self._seqs: dict[str, _Seq] = {}
        self._reserved = 0
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="sim-engine")

    async def cleanup(self) -> None:
        task, self._loop_task = self._loop_task, None
        await cancel_and_wait(task)
        for seq in list(self._seqs.values()):
            self._finish(seq, "abort")

    def capacity(self) -> Capacity:
        running: dict[str, int] = {}
        for seq in self._seqs.values():
            running[seq.request.klass] = running.get(seq.request.klass, 0) + 1
        return Capacity(total_slots=self.max_seqs,
                        free_slots=max(0, self.max_seqs - len(self._seqs)),
                        token_budget=max(0, self.kv_tokens - self._reserved),
                        running=running)

    def num_running(self) -> int:
        return len(self._seqs)

    async def abort(self, request_id: str) -> None:
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, "abort")

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id} is already running")
        chars = len(request.prompt) if request.prompt is not None else sum(
            len(m.content) for m in request.messages)
        prompt_tokens = max(1, math.ceil(chars / 4))
        seq = _Seq(request, prompt_tokens, prompt_tokens + request.sampling.max_tokens,
                   next(self._order), logprob=self.confidence(request) if request.logprobs else 0.0)
        self._seqs[request.request_id] = seq
        self._reserved += seq.reserve
        heapq.heappush(self._waiting, (request.priority, seq.order, seq))
        self._wake.set()
        try:
            while True:
                if not seq.buffer:
                    seq.waiter = asyncio.get_running_loop().create_future()
                    await seq.waiter
                out = seq.buffer.popleft()
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if not seq.done:                # the consumer went away: free the slot
                self._finish(seq, "abort")

    # -- the step loop --------------------------------------------------------------------
    async def _run(self) -> None:
        p = self.profile
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            prefill = 0
            while self._waiting:
                _, _, seq = self._waiting[0]
                if seq.done:
                    heapq.heappop(self._waiting)
                    continue
                if len(self._running) >= self.max_seqs:
                    break
                heapq.heappop(self._waiting)
                self._running[seq.request.request_id] = seq
                prefill += seq.prompt_tokens
            step = (prefill * p.prefill_s_per_token + p.decode_base_s
                    + len(self._running) * p.decode_s_per_seq) / self.speed
            await asyncio.sleep(step)
            self.steps += 1
            for seq in list(self._running.values()):
                self._decode_one(seq)

    def confidence(self, request: EngineRequest) -> float:
        """The SIMULATED model's mean token logprob for a request: a stable number per prompt in
        [-2, 0] (a hash, not a model), so the cascade has a signal to act on."""
        text = request.prompt if request.prompt is not None else "".join(m.content for m in request.messages)
        return -(zlib.crc32(text.encode()) % 2000) / 1000

    def _decode_one(self, seq: _Seq) -> None:
        word = _WORDS[(seq.order + seq.produced) % len(_WORDS)]
        seq.produced += 1
        seq.text += word
        token_id = 1000 + (seq.order + seq.produced) % len(_WORDS)
        logprobs = [seq.logprob] if seq.request.logprobs else []
        stop = next((s for s in seq.request.sampling.stop if s and s in seq.text), None)
        if stop is not None:
            seq.push(EngineOutput(word[: max(0, len(word) - len(stop))], [token_id], logprobs=logprobs))
            self._finish(seq, "stop")
        elif seq.produced >= seq.request.sampling.max_tokens:
            seq.push(EngineOutput(word, [token_id], logprobs=logprobs))
            self._finish(seq, "length")
        else:
            seq.push(EngineOutput(word, [token_id], logprobs=logprobs))

    def _finish(self, seq: _Seq, reason: str) -> None:
        if seq.done:
            return
        seq.done = True
        self._running.pop(seq.request.request_id, None)
        self._seqs.pop(seq.request.request_id, None)
        self._reserved -= seq.reserve
        seq.push(EngineOutput("", [], finish_reason=reason, prompt_tokens=seq.prompt_tokens,
                              completion_tokens=seq.produced))
