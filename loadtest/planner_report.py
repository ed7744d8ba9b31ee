"""The planner's report: the reference-table rows (loadtest/planner_rows.py), the budget verdict,
and the text rendering. Pure: builds values and strings, prints nothing."""

from __future__ import annotations

from msgspec import Struct

from loadtest.planner_model import (
    HOURS_PER_YEAR,
    QUANT_BYTES,
    Fleet,
    LoadFigures,
    MixOption,
    PlanInput,
    load_figures,
    plan_fleet,
    replica_for,
    search_mix,
)
from loadtest.planner_rows import Row, _largest, _load_words, _n, _params, _usd, fleet_rows, load_rows


class Verdict(Struct, kw_only=True):
    question: str
    model: str
    fits: bool  # all traffic on the largest model meets latency and the budget
    weights_gb: float
    gpus_for_weights: int
    gpus_for_kv: int
    in_flight: float
    kv_gb_at_peak: float
    replica_gpus: int
    step_ms: float
    stream_tps: float
    ttft_s: float
    latency_ok: bool
    fleet_gpus: int
    usd_per_year: float
    budget_usd_year: float
    budget_ratio: float  # cost ÷ budget
    weights_floor_usd_per_year: float
    break_even_usd_per_gpu_hour: float
    max_large_share: float  # the largest share of the big model in any mix that fits
    best_mix: MixOption | None
    api_only_usd_per_year: float
    summary: str


class Report(Struct, kw_only=True):
    scenario: str
    input: PlanInput
    load: LoadFigures
    fleet: Fleet
    rows: list[Row]
    verdict: Verdict | None


def build_verdict(inp: PlanInput, lf: LoadFigures) -> Verdict | None:
    if inp.budget_usd_year is None:
        return None
    big, gpu, ld = _largest(inp), inp.gpu, inp.load
    fleet = plan_fleet(inp, {m.name: float(m is big) for m in inp.models})
    pool = fleet.pools[0]
    rep = pool.replica
    mixes = search_mix(inp)
    max_big = max((o.shares[big.name] for o in mixes), default=0.0)
    api_year = lf.daily_requests * (ld.tokens_in + ld.tokens_out) / 1e6 * inp.api.usd_per_mtok * 365
    fits = bool(fleet.fits_budget and fleet.latency_ok)
    best = mixes[0] if mixes else None
    gpu_year = gpu.usd_per_hour * HOURS_PER_YEAR
    summary = (
        f"{'YES' if fits else 'NO'}: all traffic on {big.name} needs {fleet.gpus} "
        f"{gpu.name} = {_usd(fleet.usd_per_year)}/yr, "
        f"{fleet.usd_per_year / inp.budget_usd_year:.1f}× the {_usd(inp.budget_usd_year)} "
        f"budget. "
    )
    if not fits:
        summary += (
            f"Its weights alone need {pool.gpus_for_weights} GPU"
            f"{'s' if pool.gpus_for_weights > 1 else ''} "
            f"({_usd(pool.gpus_for_weights * gpu_year)}/yr); one deployable "
            f"{rep.gpus}-GPU replica costs {_usd(rep.gpus * gpu_year)}/yr. "
        )
    if best:
        mix = ", ".join(f"{k} {v:.0%}" for k, v in best.shares.items() if v)
        summary += f"Best mix within budget: {mix} → {best.gpus} {gpu.name}, {_usd(best.usd_per_year)}/yr; "
        summary += (
            f"at most {max_big:.0%} can go to {big.name}."
            if max_big
            else f"no fitting mix can keep even one {big.name} replica."
        )
    else:
        summary += "No mix of the listed models fits."
    return Verdict(
        question=(
            f"Can {_params(big.total_params_b)}-A{_params(big.active_params_b)} "
            f"{big.quant.upper()} serve {_load_words(inp)} at TTFT < {inp.slo.ttft_s:g} s "
            f"within {_usd(inp.budget_usd_year)}/yr?"
        ),
        model=big.name,
        fits=fits,
        weights_gb=rep.weight_gb,
        gpus_for_weights=pool.gpus_for_weights,
        gpus_for_kv=pool.gpus_for_kv,
        in_flight=pool.in_flight,
        kv_gb_at_peak=pool.kv_gb_at_peak,
        replica_gpus=rep.gpus,
        step_ms=rep.step_ms,
        stream_tps=rep.stream_tps,
        ttft_s=rep.ttft_s,
        latency_ok=rep.latency_ok,
        fleet_gpus=fleet.gpus,
        usd_per_year=fleet.usd_per_year,
        budget_usd_year=inp.budget_usd_year,
        budget_ratio=fleet.usd_per_year / inp.budget_usd_year,
        weights_floor_usd_per_year=pool.gpus_for_weights * gpu_year,
        break_even_usd_per_gpu_hour=inp.budget_usd_year / (fleet.gpus * HOURS_PER_YEAR),
        max_large_share=max_big,
        best_mix=best,
        api_only_usd_per_year=api_year,
        summary=summary,
    )


def _verdict_rows(inp: PlanInput, v: Verdict, lf: LoadFigures) -> list[Row]:
    big, gpu, ld, eff = _largest(inp), inp.gpu, inp.load, inp.efficiency
    rep = replica_for(big, inp)
    ctx = ld.tokens_in + ld.tokens_out
    kv_kib = rep.kv_bytes_per_token / 1024
    step_kv_gb = rep.batch * (ld.tokens_in + ld.tokens_out / 2) * rep.kv_bytes_per_token / 1e9
    step_w_gb = min(big.weight_bytes(), rep.batch * big.active_bytes()) / 1e9
    tflops = gpu.tflops_for(big.quant)
    prefill_gpus = lf.peak_qps * ld.prefill_tokens() * 2 * big.active_params_b * 1e9 / (tflops * 1e12 * eff.mfu)
    year = f"${gpu.usd_per_hour:.2f} × 8,760 h"
    rows = [
        (
            "Weights",
            f"{_params(big.total_params_b)} × {QUANT_BYTES[big.quant]:g} B ({big.quant}) = "
            f"{_n(v.weights_gb)} GB ÷ ({gpu.memory_gb:g} GB × {eff.mem_util:g})",
            f"{v.gpus_for_weights} GPUs floor; replica {v.replica_gpus}",
        ),
        (
            "KV cache at peak",
            f"{_n(v.in_flight)} seqs × {_n(ctx)} tok × {kv_kib:g} KiB = {_n(v.kv_gb_at_peak)} GB "
            f"÷ {gpu.memory_gb * eff.mem_util:g} GB",
            f"{v.gpus_for_kv} GPUs",
        ),
        (
            "Decode roofline",
            f"batch {rep.batch} ({rep.batch_limit}): ({_n(step_w_gb)} + {_n(step_kv_gb)} GB) "
            f"÷ ({rep.gpus} × {gpu.bandwidth_tbs:g} TB/s × {eff.bw_eff:g})",
            f"{v.step_ms:.1f} ms/step = {v.stream_tps:.0f} tok/s/user "
            f"{'≥' if v.latency_ok else '<'} {inp.slo.min_stream_tps:g}",
        ),
        (
            "Prefill",
            f"{lf.peak_qps:g} QPS × {_n(ld.prefill_tokens())} × 2 × {_params(big.active_params_b)} "
            f"÷ ({_n(tflops)} TFLOPS × {eff.mfu:g})",
            f"{prefill_gpus:.1f} GPU-equivalents",
        ),
        (
            "Fleet cost",
            f"{v.fleet_gpus} {gpu.name} × {year}",
            f"{_usd(v.usd_per_year)}/yr = {v.budget_ratio:.2f}× budget",
        ),
        (
            "Weights alone",
            f"{v.gpus_for_weights} × {year} (no KV at all)",
            f"{_usd(v.weights_floor_usd_per_year)}/yr "
            f"({v.weights_floor_usd_per_year / v.budget_usd_year:.0%} of budget)",
        ),
        (
            "Break-even price",
            f"{_usd(v.budget_usd_year)} ÷ ({v.fleet_gpus} × 8,760 h)",
            f"${v.break_even_usd_per_gpu_hour:.2f}/GPU-h",
        ),
    ]
    if v.best_mix:
        mix = " / ".join(f"{k} {s:.0%}" for k, s in v.best_mix.shares.items())
        rows.append(
            (
                "Best mix in budget",
                f"grid search, step {inp.mix_step:g}: {mix}",
                f"{v.best_mix.gpus} {gpu.name}, {_usd(v.best_mix.usd_per_year)}/yr",
            )
        )
    rows.append(
        (
            "Hosted API instead",
            f"{_n(lf.daily_requests)} req/day × {_n(ctx)} tok × ${inp.api.usd_per_mtok:g}/1M × 365",
            f"{_usd(v.api_only_usd_per_year)}/yr",
        )
    )
    return [Row(section="verdict", metric=m, arithmetic=a, result=r) for m, a, r in rows]


def build_report(inp: PlanInput) -> Report:
    lf = load_figures(inp)
    fleet = plan_fleet(inp)
    doc = inp.reference or ""
    rows = load_rows(inp, lf, doc) + fleet_rows(inp, lf, fleet, doc)
    verdict = build_verdict(inp, lf)
    if verdict:
        rows += _verdict_rows(inp, verdict, lf)
    return Report(scenario=inp.name, input=inp, load=lf, fleet=fleet, rows=rows, verdict=verdict)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in body)]


def render_text(rep: Report) -> str:
    gpu, eff = rep.input.gpu, rep.input.efficiency
    out = [
        f"laneway plan: {rep.scenario}",
        f"GPU {gpu.name}: {gpu.memory_gb:g} GB, {gpu.bandwidth_tbs:g} TB/s, dense TFLOPS "
        f"BF16 {gpu.tflops_bf16:g} / FP8 {gpu.tflops_fp8:g} / FP4 {gpu.tflops_fp4:g}, "
        f"${gpu.usd_per_hour:.2f}/h (assumed). Memory use {eff.mem_util:g}, bandwidth "
        f"efficiency {eff.bw_eff:g}, MFU {eff.mfu:g}. Roofline: no queueing.",
        "",
    ]
    for section in ("load", "fleet", "verdict"):
        body = [[r.metric, r.arithmetic, r.result, r.document] for r in rep.rows if r.section == section]
        if body:
            head = ["metric", "arithmetic", "result", "document"]
            out += [f"[{section}]", *_table(head, body), ""]
    pools = [
        [
            p.model,
            f"{p.share:.0%}",
            f"{p.qps:.1f}",
            _n(p.in_flight),
            str(p.replica.gpus),
            f"{p.replica.batch} ({p.replica.batch_limit})",
            f"{p.replica.step_ms:.1f}",
            f"{p.replica.stream_tps:.0f}",
            f"{p.replica.ttft_s:.3f}",
            f"{p.decode_replicas:.2f}+{p.prefill_replicas:.2f}",
            str(p.replicas),
            str(p.gpus),
            _n(p.gpus * gpu.usd_per_hour * 24),
        ]
        for p in rep.fleet.pools
    ]
    out += [
        "[pools: the configured mix]",
        *_table(
            [
                "model",
                "share",
                "QPS",
                "in flight",
                "GPUs/rep",
                "batch",
                "step ms",
                "tok/s/user",
                "TTFT s",
                "dec+pre",
                "replicas",
                "GPUs",
                "$/day",
            ],
            pools,
        ),
        "",
    ]
    if rep.verdict:
        out += [f"[verdict] {rep.verdict.question}", rep.verdict.summary]
    return "\n".join(out).rstrip() + "\n"
