"""The planner's report: reference-table rows with their arithmetic, the budget verdict, and the
text rendering. Pure: builds values and strings, prints nothing."""

from __future__ import annotations

from msgspec import Struct

from loadtest.planner_model import (
    HOURS_PER_YEAR,
    QUANT_BYTES,
    Fleet,
    LoadFigures,
    MixOption,
    Model,
    PlanInput,
    load_figures,
    plan_fleet,
    replica_for,
    search_mix,
    without_prefix_cache,
)

# The documents' own figures, shown beside ours (reference/000 "Capacity math",
# reference/004 "Back-of-envelope Estimation").
DOC_B2B = {"volume": "100,000 requests", "concurrency": "5,000 users",
           "budget": "$500,000", "slo": "p95 < 1s"}
DOC_COST = {"tokens": "~228K tok/s", "all_large": "~40 H100s (rough)",
            "mix": "~0.4x -> ~16 H100-eq", "api_tokens": "~2B tokens/day",
            "api_cost": "~$6K/day worst", "mix_cost": "~$1.2K/day", "slo": "TTFT p95 < 800ms"}
DOC_ALL_LARGE_H100 = 40  # the cost-stack document's rough all-70B figure


class Row(Struct, kw_only=True):
    section: str
    metric: str
    arithmetic: str
    result: str
    document: str = ""


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


def _load_rows(inp: PlanInput, lf: LoadFigures, doc: str) -> list[Row]:
    ld, b2b, cost = inp.load, doc == "b2b", doc == "cost-stack"
    rows = []
    if ld.dau:
        vol = (f"{_n(ld.dau)} DAU × {ld.requests_per_user_day:g} req/user/day; "
               f"÷ 86,400 = {lf.avg_qps:.2f} QPS avg × peak {ld.peak_factor:g}")
        res = f"{_n(lf.daily_requests)} req/day, {lf.volume_peak_qps:.1f} QPS peak"
        rows.append(Row(section="load", metric="Daily request volume", arithmetic=vol,
                        result=res, document=DOC_B2B["volume"] if b2b else ""))
    else:
        rows.append(Row(section="load", metric="Daily request volume",
                        arithmetic=f"{ld.qps:g} QPS × 86,400 s (peak all day: worst case)",
                        result=f"{_si(lf.daily_requests)} req/day"))
    if lf.concurrency_qps is not None and lf.in_flight is not None:
        arith = (f"{_n(ld.concurrency or 0)} users ÷ ({ld.tokens_out} tok ÷ "
                 f"{inp.slo.min_stream_tps:g} tok/s = {lf.request_s:g} s + think "
                 f"{ld.think_time_s:g} s)")
        res = f"{_n(lf.in_flight)} in flight, {lf.concurrency_qps:.0f} QPS"
        if lf.concurrency_qps > lf.volume_peak_qps * 1.5:
            res += f" ({lf.concurrency_qps / lf.volume_peak_qps:.0f}× volume peak; sized for this)"
        rows.append(Row(section="load", metric="Peak concurrent users", arithmetic=arith,
                        result=res, document=DOC_B2B["concurrency"] if b2b else ""))
    tps = lf.peak_qps * (ld.tokens_in + ld.tokens_out)
    rows.append(Row(section="load", metric="Tokens/sec peak",
                    arithmetic=f"{lf.peak_qps:g} × ({_n(ld.tokens_in)} + {_n(ld.tokens_out)})",
                    result=f"{_n(tps)} tokens/s", document=DOC_COST["tokens"] if cost else ""))
    if inp.budget_usd_year:
        per_h = inp.budget_usd_year / HOURS_PER_YEAR
        rows.append(Row(section="load", metric="Annual budget",
                        arithmetic=(f"{_usd(inp.budget_usd_year)} ÷ 8,760 h = ${per_h:.2f}/h ÷ "
                                    f"${inp.gpu.usd_per_hour:.2f}/GPU-h"),
                        result=f"{per_h / inp.gpu.usd_per_hour:.1f} {inp.gpu.name} all year",
                        document=DOC_B2B["budget"] if b2b else ""))
    return rows


def _fleet_rows(inp: PlanInput, lf: LoadFigures, fleet: Fleet, doc: str) -> list[Row]:
    cost, ld, gpu = doc == "cost-stack", inp.load, inp.gpu
    big = _largest(inp)
    rep = replica_for(big, inp)
    all_big = plan_fleet(inp, {m.name: float(m is big) for m in inp.models})
    p = all_big.pools[0]
    tps = lf.peak_qps * (ld.tokens_in + ld.tokens_out)

    def add(metric: str, arithmetic: str, result: str, document: str = "") -> None:
        rows.append(Row(section="fleet", metric=metric, arithmetic=arithmetic, result=result,
                        document=document))

    rows: list[Row] = []
    add("Latency SLO",
        f"p95 read as TTFT (streamed) = {_n(ld.prefill_tokens())} × 2 × {_params(big.active_params_b)} "
        f"÷ ({rep.gpus} × {_n(gpu.tflops_for(big.quant))} TFLOPS × {inp.efficiency.mfu:g}) + 1 step",
        f"{rep.ttft_s:.3f} s vs {inp.slo.ttft_s:g} s (no queueing)",
        DOC_COST["slo"] if cost else DOC_B2B["slo"] if doc == "b2b" else "")
    add(f"If all {big.name}",
        f"{p.replicas} × {rep.gpus}-GPU replicas (decode {p.decode_replicas:.1f} + prefill "
        f"{p.prefill_replicas:.1f}); {_n(tps)} ÷ {all_big.gpus} = {_si(tps / all_big.gpus)} tok/s/GPU",
        f"{all_big.gpus} {gpu.name}" + (
            f"; {all_big.gpus / DOC_ALL_LARGE_H100:.2f}× the doc's 40" if cost else ""),
        DOC_COST["all_large"] if cost else "")
    if len(fleet.pools) > 1:
        # The document's shortcut: GPU need scales with active params. Ours: the roofline pools.
        active = {m.name: m.active_params_b for m in inp.models}
        weighted = sum(q.share * active[q.model] for q in fleet.pools) / big.active_params_b
        terms = " + ".join(f"{q.share:g} × {active[q.model]:g}/{big.active_params_b:g}"
                           for q in fleet.pools)
        base, label = (DOC_ALL_LARGE_H100, "doc's ") if cost else (all_big.gpus, "")
        pools = " + ".join(f"{q.replicas}×{q.replica.gpus}" for q in fleet.pools)
        add("Routing mix",
            f"{terms} = {weighted:.2f}× → {label}{base} × {weighted:.2f} = {base * weighted:.1f}; "
            f"roofline {pools}",
            f"{fleet.gpus} {gpu.name} ({fleet.gpus / all_big.gpus:.2f}× all-large)",
            DOC_COST["mix"] if cost else "")
    if inp.api.fallback_share > 0:
        share, tok, price = inp.api.fallback_share, ld.tokens_in + ld.tokens_out, inp.api.usd_per_mtok
        add(f"API fallback {share:.0%}",
            f"{_n(lf.daily_requests)} req × {share:g} × {_si(tok)}" if ld.dau else
            f"{lf.peak_qps:g} × {share:g} = {lf.peak_qps * share:g} QPS × {_si(tok)} × 86,400",
            f"{_si(fleet.api_tokens_per_day)} tokens/day", DOC_COST["api_tokens"] if cost else "")
        add(f"API cost @ ${price:g}/1M", f"{_si(fleet.api_tokens_per_day)} × ${price:g}/1M",
            f"${_n(fleet.api_usd_per_day)}/day", DOC_COST["api_cost"] if cost else "")
    if ld.prefix_hit_rate > 0:      # what the cache saves: the same plan with every token prefilled
        cold = plan_fleet(without_prefix_cache(inp))
        add(f"Prefix cache {ld.prefix_hit_rate:.0%}",
            f"prefill {_n(ld.tokens_in)} × (1 − {ld.prefix_hit_rate:g}) = {_n(ld.prefill_tokens())} tok/request; "
            f"{cold.gpus} → {fleet.gpus} {gpu.name}",
            f"{cold.gpus - fleet.gpus} GPUs, {_usd(cold.usd_per_year - fleet.usd_per_year)}/yr saved")
    add("Mix cost (GPUs)", f"{fleet.gpus} {gpu.name} × 24 h × ${gpu.usd_per_hour:.2f}/h",
        f"${_n(fleet.gpu_usd_per_day)}/day", DOC_COST["mix_cost"] if cost else "")
    if fleet.api_usd_per_day:
        add("Mix cost + fallback",
            f"${_n(fleet.gpu_usd_per_day)} + ${_n(fleet.api_usd_per_day)} (fallback all day); × 365",
            f"${_n(fleet.usd_per_day)}/day, {_usd(fleet.usd_per_year)}/yr")
    return rows


def build_verdict(inp: PlanInput, lf: LoadFigures) -> Verdict | None:
    if inp.budget_usd_year is None:
        return None
    big, gpu, ld = _largest(inp), inp.gpu, inp.load
    fleet = plan_fleet(inp, {m.name: float(m is big) for m in inp.models})
    pool = fleet.pools[0]
    rep = pool.replica
    mixes = search_mix(inp)
    max_big = max((o.shares[big.name] for o in mixes), default=0.0)
    api_year = (lf.daily_requests * (ld.tokens_in + ld.tokens_out) / 1e6
                * inp.api.usd_per_mtok * 365)
    fits = bool(fleet.fits_budget and fleet.latency_ok)
    best = mixes[0] if mixes else None
    gpu_year = gpu.usd_per_hour * HOURS_PER_YEAR
    summary = (f"{'YES' if fits else 'NO'}: all traffic on {big.name} needs {fleet.gpus} "
               f"{gpu.name} = {_usd(fleet.usd_per_year)}/yr, "
               f"{fleet.usd_per_year / inp.budget_usd_year:.1f}× the {_usd(inp.budget_usd_year)} "
               f"budget. ")
    if not fits:
        summary += (f"Its weights alone need {pool.gpus_for_weights} GPU"
                    f"{'s' if pool.gpus_for_weights > 1 else ''} "
                    f"({_usd(pool.gpus_for_weights * gpu_year)}/yr); one deployable "
                    f"{rep.gpus}-GPU replica costs {_usd(rep.gpus * gpu_year)}/yr. ")
    if best:
        mix = ", ".join(f"{k} {v:.0%}" for k, v in best.shares.items() if v)
        summary += (f"Best mix within budget: {mix} → {best.gpus} {gpu.name}, "
                    f"{_usd(best.usd_per_year)}/yr; ")
        summary += (f"at most {max_big:.0%} can go to {big.name}." if max_big else
                    f"no fitting mix can keep even one {big.name} replica.")
    else:
        summary += "No mix of the listed models fits."
    return Verdict(
        question=(f"Can {_params(big.total_params_b)}-A{_params(big.active_params_b)} "
                  f"{big.quant.upper()} serve {_load_words(inp)} at TTFT < {inp.slo.ttft_s:g} s "
                  f"within {_usd(inp.budget_usd_year)}/yr?"),
        model=big.name, fits=fits, weights_gb=rep.weight_gb,
        gpus_for_weights=pool.gpus_for_weights, gpus_for_kv=pool.gpus_for_kv,
        in_flight=pool.in_flight, kv_gb_at_peak=pool.kv_gb_at_peak, replica_gpus=rep.gpus,
        step_ms=rep.step_ms,
        stream_tps=rep.stream_tps, ttft_s=rep.ttft_s, latency_ok=rep.latency_ok,
        fleet_gpus=fleet.gpus, usd_per_year=fleet.usd_per_year,
        budget_usd_year=inp.budget_usd_year,
        budget_ratio=fleet.usd_per_year / inp.budget_usd_year,
        weights_floor_usd_per_year=pool.gpus_for_weights * gpu_year,
        break_even_usd_per_gpu_hour=inp.budget_usd_year / (fleet.gpus * HOURS_PER_YEAR),
        max_large_share=max_big, best_mix=best, api_only_usd_per_year=api_year, summary=summary)


def _verdict_rows(inp: PlanInput, v: Verdict, lf: LoadFigures) -> list[Row]:
    big, gpu, ld, eff = _largest(inp), inp.gpu, inp.load, inp.efficiency
    rep = replica_for(big, inp)
    ctx = ld.tokens_in + ld.tokens_out
    kv_kib = rep.kv_bytes_per_token / 1024
    step_kv_gb = rep.batch * (ld.tokens_in + ld.tokens_out / 2) * rep.kv_bytes_per_token / 1e9
    step_w_gb = min(big.weight_bytes(), rep.batch * big.active_bytes()) / 1e9
    tflops = gpu.tflops_for(big.quant)
    prefill_gpus = lf.peak_qps * ld.prefill_tokens() * 2 * big.active_params_b * 1e9 / (
        tflops * 1e12 * eff.mfu)
    year = f"${gpu.usd_per_hour:.2f} × 8,760 h"
    rows = [
        ("Weights",
         f"{_params(big.total_params_b)} × {QUANT_BYTES[big.quant]:g} B ({big.quant}) = "
         f"{_n(v.weights_gb)} GB ÷ ({gpu.memory_gb:g} GB × {eff.mem_util:g})",
         f"{v.gpus_for_weights} GPUs floor; replica {v.replica_gpus}"),
        ("KV cache at peak",
         f"{_n(v.in_flight)} seqs × {_n(ctx)} tok × {kv_kib:g} KiB = {_n(v.kv_gb_at_peak)} GB "
         f"÷ {gpu.memory_gb * eff.mem_util:g} GB",
         f"{v.gpus_for_kv} GPUs"),
        ("Decode roofline",
         f"batch {rep.batch} ({rep.batch_limit}): ({_n(step_w_gb)} + {_n(step_kv_gb)} GB) "
         f"÷ ({rep.gpus} × {gpu.bandwidth_tbs:g} TB/s × {eff.bw_eff:g})",
         f"{v.step_ms:.1f} ms/step = {v.stream_tps:.0f} tok/s/user "
         f"{'≥' if v.latency_ok else '<'} {inp.slo.min_stream_tps:g}"),
        ("Prefill",
         f"{lf.peak_qps:g} QPS × {_n(ld.prefill_tokens())} × 2 × {_params(big.active_params_b)} "
         f"÷ ({_n(tflops)} TFLOPS × {eff.mfu:g})",
         f"{prefill_gpus:.1f} GPU-equivalents"),
        ("Fleet cost", f"{v.fleet_gpus} {gpu.name} × {year}",
         f"{_usd(v.usd_per_year)}/yr = {v.budget_ratio:.2f}× budget"),
        ("Weights alone", f"{v.gpus_for_weights} × {year} (no KV at all)",
         f"{_usd(v.weights_floor_usd_per_year)}/yr "
         f"({v.weights_floor_usd_per_year / v.budget_usd_year:.0%} of budget)"),
        ("Break-even price", f"{_usd(v.budget_usd_year)} ÷ ({v.fleet_gpus} × 8,760 h)",
         f"${v.break_even_usd_per_gpu_hour:.2f}/GPU-h"),
    ]
    if v.best_mix:
        mix = " / ".join(f"{k} {s:.0%}" for k, s in v.best_mix.shares.items())
        rows.append(("Best mix in budget", f"grid search, step {inp.mix_step:g}: {mix}",
                     f"{v.best_mix.gpus} {gpu.name}, {_usd(v.best_mix.usd_per_year)}/yr"))
    rows.append(("Hosted API instead",
                 f"{_n(lf.daily_requests)} req/day × {_n(ctx)} tok × "
                 f"${inp.api.usd_per_mtok:g}/1M × 365",
                 f"{_usd(v.api_only_usd_per_year)}/yr"))
    return [Row(section="verdict", metric=m, arithmetic=a, result=r) for m, a, r in rows]


def build_report(inp: PlanInput) -> Report:
    lf = load_figures(inp)
    fleet = plan_fleet(inp)
    doc = inp.reference or ""
    rows = _load_rows(inp, lf, doc) + _fleet_rows(inp, lf, fleet, doc)
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
    out = [f"laneway plan: {rep.scenario}",
           f"GPU {gpu.name}: {gpu.memory_gb:g} GB, {gpu.bandwidth_tbs:g} TB/s, dense TFLOPS "
           f"BF16 {gpu.tflops_bf16:g} / FP8 {gpu.tflops_fp8:g} / FP4 {gpu.tflops_fp4:g}, "
           f"${gpu.usd_per_hour:.2f}/h (assumed). Memory use {eff.mem_util:g}, bandwidth "
           f"efficiency {eff.bw_eff:g}, MFU {eff.mfu:g}. Roofline: no queueing.", ""]
    for section in ("load", "fleet", "verdict"):
        body = [[r.metric, r.arithmetic, r.result, r.document]
                for r in rep.rows if r.section == section]
        if body:
            head = ["metric", "arithmetic", "result", "document"]
            out += [f"[{section}]", *_table(head, body), ""]
    pools = [[p.model, f"{p.share:.0%}", f"{p.qps:.1f}", _n(p.in_flight), str(p.replica.gpus),
              f"{p.replica.batch} ({p.replica.batch_limit})", f"{p.replica.step_ms:.1f}",
              f"{p.replica.stream_tps:.0f}", f"{p.replica.ttft_s:.3f}",
              f"{p.decode_replicas:.2f}+{p.prefill_replicas:.2f}", str(p.replicas), str(p.gpus),
              _n(p.gpus * gpu.usd_per_hour * 24)] for p in rep.fleet.pools]
    out += ["[pools: the configured mix]",
            *_table(["model", "share", "QPS", "in flight", "GPUs/rep", "batch", "step ms",
                     "tok/s/user", "TTFT s", "dec+pre", "replicas", "GPUs", "$/day"], pools), ""]
    if rep.verdict:
        out += [f"[verdict] {rep.verdict.question}", rep.verdict.summary]
    return "\n".join(out).rstrip() + "\n"
