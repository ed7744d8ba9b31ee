"""Recorded requests → figures: per class / tenant / flow latency percentiles, throughput,
errors by type, SLO attainment, and time series for the report. Pure functions, no I/O.

Conventions:
- Latencies, errors and SLOs count requests sent inside the window (a warm-up before it is
  excluded); throughput counts every token that arrived inside it.
- TTFT counts every request that got a first token (also those cut at the end of a phase);
  a request cut before its first token is censored: counted as `cut_waiting`, not in TTFT.
- Inter-token latency pools the gaps between consecutive content chunks of all requests.
- End-to-end counts requests that finished (not cut, no error).
- Throughput counts tokens whose arrival time falls inside the measurement window, so long
  generations that straddle the window contribute exactly their share.
- SLO attainment: the fraction of requests (with a first token, or failed) whose TTFT met the
  bound; failed requests count as misses. "p95 < 1 s" (B2B) is applied to TTFT: for a streamed
  reply it is the time until the user sees the answer begin.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from loadtest.http_client import Result
from loadtest.stats import summary
from loadtest.traffic import Sample


def token_times(r: Result) -> list[float]:
    """Unix arrival time of each content chunk."""
    if r.ttft is None:
        return []
    t = r.started_at + r.ttft
    times = [t]
    for gap in r.gaps:
        t += gap
        times.append(t)
    return times


def error_kind(r: Result) -> str | None:
    if r.error is not None:
        return r.error
    if r.cut or r.status == 200:
        return None
    return f"http_{r.status}"


def tokens_in(results: Iterable[Result], t0: float, t1: float) -> int:
    n = 0
    for r in results:
        for t in token_times(r):
            if t0 <= t < t1:
                n += 1
    return n


def slo(values: Sequence[float], failed: int, bound: float) -> dict:
    total = len(values) + failed
    p95 = summary(values)["p95"]
    return {
        "bound_s": bound,
        "p95_s": p95,
        "met": bool(values) and p95 < bound and failed == 0,
        "attainment": (sum(1 for v in values if v < bound) / total) if total else math.nan,
    }


def group_stats(
    results: Sequence[Result], window: tuple[float, float], slo_ttft_s: float = 0.8, slo_latency_s: float = 1.0
) -> dict:
    t0, t1 = window
    span = max(1e-9, t1 - t0)
    everything, results = results, [r for r in results if r.started_at >= t0]  # latency: no warm-up
    errors = Counter(k for r in results if (k := error_kind(r)) is not None)
    failed = sum(errors.values())
    ttft = [r.ttft for r in results if r.ttft is not None]
    gaps = [g for r in results for g in r.gaps]
    done = [r for r in results if not r.cut and error_kind(r) is None]
    return {
        "requests": len(results),
        "completed": len(done),
        "failed": failed,
        "cut": sum(1 for r in results if r.cut),
        "cut_waiting": sum(1 for r in results if r.cut and r.ttft is None),
        "errors": dict(errors),
        "ttft_s": summary(ttft),
        "itl_s": summary(gaps),
        "e2e_s": summary([r.e2e for r in done]),
        "tokens": sum(r.tokens for r in results),
        "tokens_in_window": (n := tokens_in(everything, t0, t1)),
        "tokens_per_s": n / span,
        "requests_per_s": sum(
            1 for r in everything if not r.cut and error_kind(r) is None and t0 <= r.started_at + r.e2e < t1
        )
        / span,
        "slo": {"ttft_800ms": slo(ttft, failed, slo_ttft_s), "latency_1s": slo(ttft, failed, slo_latency_s)},
    }


def grouped(
    results: Sequence[Result], key: Callable[[Result], str], window: tuple[float, float], **slo_bounds: float
) -> dict[str, dict]:
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    return {name: group_stats(rs, window, **slo_bounds) for name, rs in sorted(groups.items())}


def timeline(results: Sequence[Result], samples: Sequence[Sample], t0: float, t1: float, bin_s: float = 1.0) -> dict:
    """Tokens/s per flow in bins, and the sampled in-flight / waiting counts, relative to t0."""
    bins = max(1, math.ceil((t1 - t0) / bin_s))
    tokens: dict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    for r in results:
        series = tokens[r.flow]
        for t in token_times(r):
            i = int((t - t0) // bin_s)
            if 0 <= i < bins:
                series[i] += 1 / bin_s
    flows = sorted({r.flow for r in results} | {f for s in samples for f in s.inflight})
    kept = [s for s in samples if t0 <= s.t <= t1]
    return {
        "bin_s": bin_s,
        "t": [round(i * bin_s, 3) for i in range(bins)],
        "tokens_per_s": {f: [round(v, 1) for v in tokens[f]] for f in flows},
        "sample_t": [round(s.t - t0, 3) for s in kept],
        "inflight": {f: [s.inflight.get(f, 0) for s in kept] for f in flows},
        "waiting": {f: [s.waiting.get(f, 0) for s in kept] for f in flows},
        "open_streams": [s.open_streams for s in kept] if any(s.open_streams is not None for s in kept) else [],
    }


def run_document(
    label: str,
    results: Sequence[Result],
    samples: Sequence[Sample],
    window: tuple[float, float],
    *,
    slo_ttft_s: float = 0.8,
    slo_latency_s: float = 1.0,
    extra: dict | None = None,
) -> dict:
    """One run (or benchmark phase) as the JSON the report reads."""
    bounds = {"slo_ttft_s": slo_ttft_s, "slo_latency_s": slo_latency_s}
    last = max((r.started_at + r.e2e for r in results), default=window[1])
    start = min([window[0]] + [r.started_at for r in results])
    doc = {
        "label": label,
        "window": list(window),
        "overall": group_stats(results, window, **bounds),
        "by_class": grouped(results, lambda r: r.klass, window, **bounds),
        "by_tenant": grouped(results, lambda r: r.tenant, window, **bounds),
        "by_flow": grouped(results, lambda r: r.flow, window, **bounds),
        "ttft_samples": {
            k: sorted(
                round(r.ttft, 5) for r in results if r.klass == k and r.ttft is not None and r.started_at >= window[0]
            )
            for k in sorted({r.klass for r in results})
        },
        "timeline": timeline(results, samples, start, max(window[1], last)),
    }
    doc.update(extra or {})
    return doc


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(doc: dict) -> str:
    """Strict JSON: NaN and infinities (no samples) become null."""
    import json

    return json.dumps(_clean(doc))
