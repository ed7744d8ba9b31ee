"""The planner's reference table: the load and fleet rows, each with its arithmetic and the
document's own figure beside it, and the number formats they and the verdict print in. Pure."""

from __future__ import annotations

from msgspec import Struct

from loadtest.planner_model import (
    HOURS_PER_YEAR,
    Fleet,
    LoadFigures,
    Model,
    PlanInput,
    plan_fleet,
    replica_for,
    without_prefix_cache,
)

# The documents' own figures, shown beside ours (reference/000 "Capacity math",
# reference/004 "Back-of-envelope Estimation").
DOC_B2B = {"volume": "100,000 requests", "concurrency": "5,000 users", "budget": "$500,000", "slo": "p95 < 1s"}
DOC_COST = {
    "tokens": "~228K tok/s",
    "all_large": "~40 H100s (rough)",
    "mix": "~0.4x -> ~16 H100-eq",
    "api_tokens": "~2B tokens/day",
    "api_cost": "~$6K/day worst",
    "mix_cost": "~$1.2K/day",
    "slo": "TTFT p95 < 800ms",
}
DOC_ALL_LARGE_H100 = 40  # the cost-stack document's rough all-70B figure


class Row(Struct, kw_only=True):
    section: str
    metric: str
    arithmetic: str
    result: str
    document: str = ""


def _n(x: float, d: int = 0) -> str:
    return f"{x:,.{d}f}"


def _si(x: float) -> str:
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def _usd(x: float) -> str:
    return "$" + (_si(x) if x >= 1e4 else _n(x))


def _params(b: float) -> str:
    return f"{b / 1000:g}T" if b >= 1000 else f"{b:g}B"


def _load_words(inp: PlanInput) -> str:
    ld = inp.load
    parts = [f"{_n(ld.dau)} DAU" if ld.dau else f"{ld.qps:g} QPS"]
    if ld.concurrency:
        parts.append(f"{_n(ld.concurrency)} concurrent")
    return " / ".join(parts)


def _largest(inp: PlanInput) -> Model:
    return max(inp.models, key=lambda m: m.total_params_b)


def load_rows(inp: PlanInput, lf: LoadFigures, doc: str) -> list[Row]:
    ld, b2b, cost = inp.load, doc == "b2b", doc == "cost-stack"
    rows = []
    if ld.dau:
        vol = (
            f"{_n(ld.dau)} DAU × {ld.requests_per_user_day:g} req/user/day; "
            f"÷ 86,400 = {lf.avg_qps:.2f} QPS avg × peak {ld.peak_factor:g}"
        )
        res = f"{_n(lf.daily_requests)} req/day, {lf.volume_peak_qps:.1f} QPS peak"
        rows.append(
            Row(
                section="load",
                metric="Daily request volume",
                arithmetic=vol,
                result=res,
                document=DOC_B2B["volume"] if b2b else "",
            )
        )
    else:
        rows.append(
            Row(
                section="load",
                metric="Daily request volume",
                arithmetic=f"{ld.qps:g} QPS × 86,400 s (peak all day: worst case)",
                result=f"{_si(lf.daily_requests)} req/day",
            )
        )
    if lf.concurrency_qps is not None and lf.in_flight is not None:
        arith = (
            f"{_n(ld.concurrency or 0)} users ÷ ({ld.tokens_out} tok ÷ "
            f"{inp.slo.min_stream_tps:g} tok/s = {lf.request_s:g} s + think "
            f"{ld.think_time_s:g} s)"
        )
        res = f"{_n(lf.in_flight)} in flight, {lf.concurrency_qps:.0f} QPS"
        if lf.concurrency_qps > lf.volume_peak_qps * 1.5:
            res += f" ({lf.concurrency_qps / lf.volume_peak_qps:.0f}× volume peak; sized for this)"
        rows.append(
            Row(
                section="load",
                metric="Peak concurrent users",
                arithmetic=arith,
                result=res,
                document=DOC_B2B["concurrency"] if b2b else "",
            )
        )
    tps = lf.peak_qps * (ld.tokens_in + ld.tokens_out)
    rows.append(
        Row(
            section="load",
            metric="Tokens/sec peak",
            arithmetic=f"{lf.peak_qps:g} × ({_n(ld.tokens_in)} + {_n(ld.tokens_out)})",
            result=f"{_n(tps)} tokens/s",
            document=DOC_COST["tokens"] if cost else "",
        )
    )
    if inp.budget_usd_year:
        per_h = inp.budget_usd_year / HOURS_PER_YEAR
        rows.append(
            Row(
                section="load",
                metric="Annual budget",
                arithmetic=(
                    f"{_usd(inp.budget_usd_year)} ÷ 8,760 h = ${per_h:.2f}/h ÷ ${inp.gpu.usd_per_hour:.2f}/GPU-h"
                ),
                result=f"{per_h / inp.gpu.usd_per_hour:.1f} {inp.gpu.name} all year",
                document=DOC_B2B["budget"] if b2b else "",
            )
        )
    return rows


def fleet_rows(inp: PlanInput, lf: LoadFigures, fleet: Fleet, doc: str) -> list[Row]:
    cost, ld, gpu = doc == "cost-stack", inp.load, inp.gpu
    big = _largest(inp)
    rep = replica_for(big, inp)
    all_big = plan_fleet(inp, {m.name: float(m is big) for m in inp.models})
    p = all_big.pools[0]
    tps = lf.peak_qps * (ld.tokens_in + ld.tokens_out)

    def add(metric: str, arithmetic: str, result: str, document: str = "") -> None:
        rows.append(Row(section="fleet", metric=metric, arithmetic=arithmetic, result=result, document=document))

    rows: list[Row] = []
    add(
        "Latency SLO",
        f"p95 read as TTFT (streamed) = {_n(ld.prefill_tokens())} × 2 × {_params(big.active_params_b)} "
        f"÷ ({rep.gpus} × {_n(gpu.tflops_for(big.quant))} TFLOPS × {inp.efficiency.mfu:g}) + 1 step",
        f"{rep.ttft_s:.3f} s vs {inp.slo.ttft_s:g} s (no queueing)",
        DOC_COST["slo"] if cost else DOC_B2B["slo"] if doc == "b2b" else "",
    )
    add(
        f"If all {big.name}",
        f"{p.replicas} × {rep.gpus}-GPU replicas (decode {p.decode_replicas:.1f} + prefill "
        f"{p.prefill_replicas:.1f}); {_n(tps)} ÷ {all_big.gpus} = {_si(tps / all_big.gpus)} tok/s/GPU",
        f"{all_big.gpus} {gpu.name}" + (f"; {all_big.gpus / DOC_ALL_LARGE_H100:.2f}× the doc's 40" if cost else ""),
        DOC_COST["all_large"] if cost else "",
    )
    if len(fleet.pools) > 1:
        # The document's shortcut: GPU need scales with active params. Ours: the roofline pools.
        active = {m.name: m.active_params_b for m in inp.models}
        weighted = sum(q.share * active[q.model] for q in fleet.pools) / big.active_params_b
        terms = " + ".join(f"{q.share:g} × {active[q.model]:g}/{big.active_params_b:g}" for q in fleet.pools)
        base, label = (DOC_ALL_LARGE_H100, "doc's ") if cost else (all_big.gpus, "")
        pools = " + ".join(f"{q.replicas}×{q.replica.gpus}" for q in fleet.pools)
        add(
            "Routing mix",
            f"{terms} = {weighted:.2f}× → {label}{base} × {weighted:.2f} = {base * weighted:.1f}; roofline {pools}",
            f"{fleet.gpus} {gpu.name} ({fleet.gpus / all_big.gpus:.2f}× all-large)",
            DOC_COST["mix"] if cost else "",
        )
    if inp.api.fallback_share > 0:
        share, tok, price = inp.api.fallback_share, ld.tokens_in + ld.tokens_out, inp.api.usd_per_mtok
        add(
            f"API fallback {share:.0%}",
            f"{_n(lf.daily_requests)} req × {share:g} × {_si(tok)}"
            if ld.dau
            else f"{lf.peak_qps:g} × {share:g} = {lf.peak_qps * share:g} QPS × {_si(tok)} × 86,400",
            f"{_si(fleet.api_tokens_per_day)} tokens/day",
            DOC_COST["api_tokens"] if cost else "",
        )
        add(
            f"API cost @ ${price:g}/1M",
            f"{_si(fleet.api_tokens_per_day)} × ${price:g}/1M",
            f"${_n(fleet.api_usd_per_day)}/day",
            DOC_COST["api_cost"] if cost else "",
        )
    if ld.prefix_hit_rate > 0:  # what the cache saves: the same plan with every token prefilled
        cold = plan_fleet(without_prefix_cache(inp))
        add(
            f"Prefix cache {ld.prefix_hit_rate:.0%}",
            f"prefill {_n(ld.tokens_in)} × (1 − {ld.prefix_hit_rate:g}) = {_n(ld.prefill_tokens())} tok/request; "
            f"{cold.gpus} → {fleet.gpus} {gpu.name}",
            f"{cold.gpus - fleet.gpus} GPUs, {_usd(cold.usd_per_year - fleet.usd_per_year)}/yr saved",
        )
    add(
        "Mix cost (GPUs)",
        f"{fleet.gpus} {gpu.name} × 24 h × ${gpu.usd_per_hour:.2f}/h",
        f"${_n(fleet.gpu_usd_per_day)}/day",
        DOC_COST["mix_cost"] if cost else "",
    )
    if fleet.api_usd_per_day:
        add(
            "Mix cost + fallback",
            f"${_n(fleet.gpu_usd_per_day)} + ${_n(fleet.api_usd_per_day)} (fallback all day); × 365",
            f"${_n(fleet.usd_per_day)}/day, {_usd(fleet.usd_per_year)}/yr",
        )
    return rows
