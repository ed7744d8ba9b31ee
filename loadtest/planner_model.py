"""Capacity and budget arithmetic behind `laneway plan`: typed inputs, pure functions, no I/O.

Roofline model, one pool per model in the routing mix:
  weights   total params × bytes/param of the quantization.
  replica   the smallest tensor/expert-parallel group (1, 2, 4, 8, then whole 8-GPU nodes) whose
            usable memory holds the weights and still leaves `min_kv_fraction` for KV cache.
  decode    memory-bandwidth bound: a step reads the weights the batch touches plus every
            sequence's KV cache. The batch is the largest that fits the KV room and keeps a step
            under 1 / min_stream_tps (the per-user streaming speed we promise).
  prefill   compute bound: 2 × active params FLOPs per prompt token at `mfu`, for the prompt
            tokens not read from the prefix cache (`prefix_hit_rate`: vLLM's cached_tokens ÷
            prompt_tokens, what `laneway usage` reports). Cached tokens still hold KV memory.
  replicas  decode replicas + prefill replicas (chunked prefill shares the same GPUs).
No queueing model: figures are what the hardware sustains at full use, not p95 under bursts.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

Pos = Annotated[float, Meta(gt=0)]
NonNeg = Annotated[float, Meta(ge=0)]
Frac = Annotated[float, Meta(ge=0, le=1)]
Eff = Annotated[float, Meta(gt=0, le=1)]
PosInt = Annotated[int, Meta(gt=0)]
Quant = Literal["nvfp4", "fp8", "bf16"]

HOURS_PER_YEAR = 8760
SECONDS_PER_DAY = 86_400

# Bytes per weight. NVFP4: 4-bit E2M1 values + one FP8 (E4M3) scale per 16 values = 4.5 bits
# (the per-tensor FP32 scale is negligible). FP8: per-channel scales negligible.
QUANT_BYTES: dict[str, float] = {"nvfp4": 0.5625, "fp8": 1.0, "bf16": 2.0}


class PlanError(Exception):
    """Bad input; carries the parameter it is about so the CLI can name it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class Gpu(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    memory_gb: Pos
    bandwidth_tbs: Pos
    tflops_bf16: Pos  # dense tensor-core figures (datasheets quote 2:4 sparsity: halve them)
    tflops_fp8: NonNeg = 0.0  # 0 = no FP8 tensor cores
    tflops_fp4: NonNeg = 0.0  # 0 = no FP4 tensor cores
    usd_per_hour: NonNeg

    def tflops_for(self, quant: str) -> float:
        # Without native low-precision cores the weights are dequantised and multiplied in BF16
        # (vLLM's Marlin W4A16 / W8A16 kernels), so compute falls back to BF16.
        if quant == "nvfp4":
            return self.tflops_fp4 or self.tflops_bf16
        if quant == "fp8":
            return self.tflops_fp8 or self.tflops_bf16
        return self.tflops_bf16


class Model(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    total_params_b: Pos
    active_params_b: Pos
    quant: Quant
    share: Frac = 1.0
    kv_bytes_per_token: Pos | None = None  # give it, or the three shape fields below
    layers: PosInt | None = None
    kv_heads: PosInt | None = None
    head_dim: PosInt | None = None
    kv_dtype_bytes: Pos = 1.0  # FP8 KV cache (vLLM --kv-cache-dtype fp8)

    def kv_per_token(self) -> float:
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        assert self.layers and self.kv_heads and self.head_dim  # enforced by check_input
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes  # K and V

    def weight_bytes(self) -> float:
        return self.total_params_b * 1e9 * QUANT_BYTES[self.quant]

    def active_bytes(self) -> float:
        return self.active_params_b * 1e9 * QUANT_BYTES[self.quant]


class Load(Struct, kw_only=True, forbid_unknown_fields=True):
    qps: Pos | None = None  # peak requests/s; else derived from dau
    dau: Pos | None = None
    requests_per_user_day: Pos = 1.0
    peak_factor: Annotated[float, Meta(ge=1)] = 1.0  # peak QPS / average QPS
    concurrency: Pos | None = None  # concurrent users at peak
    think_time_s: NonNeg = 0.0  # 0: every concurrent user has a request in flight
    tokens_in: PosInt = 1500
    tokens_out: PosInt = 400
    prefix_hit_rate: Annotated[float, Meta(ge=0, lt=1)] = 0.0  # of prompt tokens, from the prefix cache

    def prefill_tokens(self) -> float:
        """Prompt tokens a request really prefills: the cache hits skip it."""
        return self.tokens_in * (1 - self.prefix_hit_rate)


class Efficiency(Struct, kw_only=True, forbid_unknown_fields=True):
    mem_util: Eff = 0.9  # vLLM gpu_memory_utilization
    bw_eff: Eff = 0.7  # achieved / peak HBM bandwidth in decode kernels
    mfu: Eff = 0.5  # achieved / peak dense FLOPS in prefill
    min_kv_fraction: Annotated[float, Meta(ge=0, lt=1)] = 0.2


class Slo(Struct, kw_only=True, forbid_unknown_fields=True):
    ttft_s: Pos = 1.0
    min_stream_tps: Pos = 20.0  # per-user tokens/s while streaming (≈ 2× reading speed)


class Api(Struct, kw_only=True, forbid_unknown_fields=True):
    usd_per_mtok: NonNeg = 3.0
    fallback_share: Frac = 0.0  # of requests, priced per token; pools are not shrunk by it


class PlanInput(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = "custom"
    reference: Literal["b2b", "cost-stack"] | None = None  # which document's table to print
    load: Load = field(default_factory=Load)
    gpu: Gpu
    models: list[Model]
    efficiency: Efficiency = field(default_factory=Efficiency)
    slo: Slo = field(default_factory=Slo)
    api: Api = field(default_factory=Api)
    budget_usd_year: Pos | None = None
    mix_step: Annotated[float, Meta(gt=0, le=0.5)] = 0.05


def check_input(inp: PlanInput) -> PlanInput:
    """The cross-field rules the types cannot say; raises PlanError naming the parameter."""
    if not inp.models:
        raise PlanError("models", "at least one model is required")
    if len(inp.models) > 5:
        raise PlanError("models", "at most 5 models (the mix search is a grid over all of them)")
    names = [m.name for m in inp.models]
    if len(set(names)) != len(names):
        raise PlanError("models.name", f"model names must be unique, got {names}")
    for i, m in enumerate(inp.models):
        if m.active_params_b > m.total_params_b:
            raise PlanError(f"models[{i}].active_params_b", "active params exceed total params")
        if m.kv_bytes_per_token is None and not (m.layers and m.kv_heads and m.head_dim):
            raise PlanError(
                f"models[{i}].kv_bytes_per_token", "give kv_bytes_per_token or layers, kv_heads and head_dim"
            )
    total = sum(m.share for m in inp.models)
    if abs(total - 1.0) > 1e-6:
        raise PlanError("mix", f"routing shares sum to {total:g}; they must sum to 1")
    if inp.load.qps is None and inp.load.dau is None:
        raise PlanError("load.qps", "give a peak QPS or a DAU count")
    return inp


class LoadFigures(Struct, kw_only=True):
    daily_requests: float
    avg_qps: float
    volume_peak_qps: float  # from qps, or DAU × requests/user ÷ 86,400 × peak factor
    request_s: float  # time one request spends streaming at the promised speed
    concurrency_qps: float | None  # concurrent users ÷ (request time + think time)
    in_flight: float | None  # concurrent users × request time ÷ (request + think)
    peak_qps: float  # the larger of the two: what the pools are sized for


def load_figures(inp: PlanInput) -> LoadFigures:
    ld = inp.load
    if ld.qps is not None:
        volume_peak = ld.qps
        # Without a DAU figure assume peak all day, as the cost-stack document does (worst case).
        daily = ld.dau * ld.requests_per_user_day if ld.dau else ld.qps * SECONDS_PER_DAY
    else:
        assert ld.dau is not None
        daily = ld.dau * ld.requests_per_user_day
        volume_peak = daily / SECONDS_PER_DAY * ld.peak_factor
    request_s = ld.tokens_out / inp.slo.min_stream_tps
    conc_qps = in_flight = None
    if ld.concurrency is not None:
        conc_qps = ld.concurrency / (request_s + ld.think_time_s)
        in_flight = conc_qps * request_s  # Little's law
    return LoadFigures(
        daily_requests=daily,
        avg_qps=daily / SECONDS_PER_DAY,
        volume_peak_qps=volume_peak,
        request_s=request_s,
        concurrency_qps=conc_qps,
        in_flight=in_flight,
        peak_qps=max(volume_peak, conc_qps or 0.0),
    )


class Replica(Struct, kw_only=True):
    """What one replica of a model does at its best batch (independent of the mix)."""

    model: str
    weight_gb: float
    kv_bytes_per_token: float
    gpus: int
    kv_seqs: int  # sequences whose full context fits the KV room
    batch: int
    batch_limit: Literal["kv-memory", "step-time"]
    step_ms: float
    step_bound: Literal["bandwidth", "compute"]
    stream_tps: float
    decode_tps: float
    ttft_s: float
    latency_ok: bool


def _step_s(m: Model, gpu: Gpu, inp: PlanInput, gpus: int, batch: int) -> tuple[float, Literal["bandwidth", "compute"]]:
    ld, eff = inp.load, inp.efficiency
    ctx_avg = ld.tokens_in + ld.tokens_out / 2  # a sequence is halfway through its reply on average
    # An MoE batch touches at most batch × active weights, never more than all of them.
    read = min(m.weight_bytes(), batch * m.active_bytes()) + batch * ctx_avg * m.kv_per_token()
    t_mem = read / (gpus * gpu.bandwidth_tbs * 1e12 * eff.bw_eff)
    t_cmp = 2 * m.active_params_b * 1e9 * batch / (gpus * gpu.tflops_for(m.quant) * 1e12 * eff.mfu)
    return (t_mem, "bandwidth") if t_mem >= t_cmp else (t_cmp, "compute")


def _replica_gpus(m: Model, usable: float, inp: PlanInput, seq_bytes: float) -> int:
    sizes = [1, 2, 4, *range(8, 513, 8)]  # TP within a node, then whole 8-GPU nodes
    for n in sizes:
        room = n * usable - m.weight_bytes()
        if room >= inp.efficiency.min_kv_fraction * n * usable and room >= seq_bytes:
            return n
    raise PlanError(f"models[{m.name}]", "weights do not fit in 512 GPUs")


def replica_for(m: Model, inp: PlanInput) -> Replica:
    gpu, ld = inp.gpu, inp.load
    usable = gpu.memory_gb * 1e9 * inp.efficiency.mem_util
    seq_bytes = m.kv_per_token() * (ld.tokens_in + ld.tokens_out)  # room for the whole context
    gpus = _replica_gpus(m, usable, inp, seq_bytes)
    kv_seqs = int((gpus * usable - m.weight_bytes()) // seq_bytes)
    target = 1 / inp.slo.min_stream_tps
    lo, hi = 1, kv_seqs  # largest batch whose step meets the target (step grows with batch)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _step_s(m, gpu, inp, gpus, mid)[0] <= target:
            lo = mid
        else:
            hi = mid - 1
    batch = lo
    step, bound = _step_s(m, gpu, inp, gpus, batch)
    prefill_s = (
        ld.prefill_tokens() * 2 * m.active_params_b * 1e9 / (gpus * gpu.tflops_for(m.quant) * 1e12 * inp.efficiency.mfu)
    )
    ttft = prefill_s + step
    return Replica(
        model=m.name,
        weight_gb=m.weight_bytes() / 1e9,
        kv_bytes_per_token=m.kv_per_token(),
        gpus=gpus,
        kv_seqs=kv_seqs,
        batch=batch,
        batch_limit="kv-memory" if batch == kv_seqs else "step-time",
        step_ms=step * 1e3,
        step_bound=bound,
        stream_tps=1 / step,
        decode_tps=batch / step,
        ttft_s=ttft,
        latency_ok=step <= target + 1e-12 and ttft <= inp.slo.ttft_s,
    )


class Pool(Struct, kw_only=True):
    model: str
    share: float
    qps: float
    in_flight: float
    kv_gb_at_peak: float
    gpus_for_weights: int  # physical floor: weights ÷ usable memory per GPU
    gpus_for_kv: int  # KV cache of every in-flight sequence ÷ usable memory per GPU
    decode_replicas: float
    prefill_replicas: float
    replicas: int
    gpus: int
    replica: Replica


def pool_for(m: Model, rep: Replica, share: float, inp: PlanInput, lf: LoadFigures) -> Pool:
    ld, gpu = inp.load, inp.gpu
    usable = gpu.memory_gb * 1e9 * inp.efficiency.mem_util
    qps = lf.peak_qps * share
    little = qps * ld.tokens_out / rep.stream_tps  # in flight at the speed the replica reaches
    in_flight = max(little, (lf.in_flight or 0.0) * share)
    kv_bytes = in_flight * (ld.tokens_in + ld.tokens_out) * rep.kv_bytes_per_token
    decode = in_flight / rep.batch
    prefill_gpu_s = (
        qps * ld.prefill_tokens() * 2 * m.active_params_b * 1e9 / (gpu.tflops_for(m.quant) * 1e12 * inp.efficiency.mfu)
    )
    prefill = prefill_gpu_s / rep.gpus
    replicas = max(1, math.ceil(decode + prefill - 1e-9))
    return Pool(
        model=m.name,
        share=share,
        qps=qps,
        in_flight=in_flight,
        kv_gb_at_peak=kv_bytes / 1e9,
        gpus_for_weights=math.ceil(m.weight_bytes() / usable),
        gpus_for_kv=math.ceil(kv_bytes / usable - 1e-9),
        decode_replicas=decode,
        prefill_replicas=prefill,
        replicas=replicas,
        gpus=replicas * rep.gpus,
        replica=rep,
    )


class Fleet(Struct, kw_only=True):
    pools: list[Pool]
    gpus: int
    gpu_usd_per_day: float
    api_tokens_per_day: float
    api_usd_per_day: float
    usd_per_day: float
    usd_per_year: float
    latency_ok: bool
    fits_budget: bool | None


def plan_fleet(
    inp: PlanInput, shares: dict[str, float] | None = None, replicas: dict[str, Replica] | None = None
) -> Fleet:
    """The fleet for a routing mix (default: the input's shares). `replicas` is a cache."""
    lf = load_figures(inp)
    reps = replicas or {m.name: replica_for(m, inp) for m in inp.models}
    mix = shares if shares is not None else {m.name: m.share for m in inp.models}
    pools = [pool_for(m, reps[m.name], mix[m.name], inp, lf) for m in inp.models if mix.get(m.name, 0.0) > 0]
    gpus = sum(p.gpus for p in pools)
    gpu_day = gpus * inp.gpu.usd_per_hour * 24
    ld = inp.load
    api_tokens = inp.api.fallback_share * lf.daily_requests * (ld.tokens_in + ld.tokens_out)
    api_day = api_tokens / 1e6 * inp.api.usd_per_mtok
    year = (gpu_day + api_day) * 365
    return Fleet(
        pools=pools,
        gpus=gpus,
        gpu_usd_per_day=gpu_day,
        api_tokens_per_day=api_tokens,
        api_usd_per_day=api_day,
        usd_per_day=gpu_day + api_day,
        usd_per_year=year,
        latency_ok=all(p.replica.latency_ok for p in pools),
        fits_budget=None if inp.budget_usd_year is None else year <= inp.budget_usd_year,
    )


def without_prefix_cache(inp: PlanInput) -> PlanInput:
    """The same plan with every prompt token prefilled: the baseline the cache's savings are against."""
    return msgspec.structs.replace(inp, load=msgspec.structs.replace(inp.load, prefix_hit_rate=0.0))


class MixOption(Struct, kw_only=True):
    shares: dict[str, float]
    gpus: int
    usd_per_year: float
    quality: float  # share-weighted active params (B): a crude proxy for answer quality


def _compositions(steps: int, parts: int) -> list[tuple[int, ...]]:
    out = []  # stars and bars: every way to split `steps` units over `parts` models
    for bars in combinations(range(steps + parts - 1), parts - 1):
        edges = (-1, *bars, steps + parts - 1)
        out.append(tuple(edges[i + 1] - edges[i] - 1 for i in range(parts)))
    return out


def search_mix(inp: PlanInput) -> list[MixOption]:
    """Every grid mix that meets the latency check and the budget, best quality first."""
    if inp.budget_usd_year is None:
        return []
    reps = {m.name: replica_for(m, inp) for m in inp.models}
    steps = round(1 / inp.mix_step)
    found = []
    for combo in _compositions(steps, len(inp.models)):
        shares = {m.name: c / steps for m, c in zip(inp.models, combo, strict=True)}
        fleet = plan_fleet(inp, shares, reps)
        if fleet.fits_budget and fleet.latency_ok:
            quality = sum(shares[m.name] * m.active_params_b for m in inp.models)
            found.append(MixOption(shares=shares, gpus=fleet.gpus, usd_per_year=fleet.usd_per_year, quality=quality))
    found.sort(key=lambda o: (-o.quality, o.usd_per_year))
    return found
