"""What `laneway top` shows, from the processes' scraped metrics: pure, one frame of text.

A `Frame` is one scrape of every process the scrape config names. The lanes table has a row per
class (all its tenants) and one per (class, tenant) under it: waiting in the brokers' lanes,
running in the workers' engines, the clients' TTFT p95 at the bridges, and the requests refused.
TTFT p95 is over the window between two frames when there is an earlier one (the live view),
since each bridge started otherwise (`--once`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from core.promtext import Scrape, bucket_delta, histogram_quantile
from laneway.scrape_config import Target

ALL = "(all)"


@dataclass(frozen=True, slots=True)
class Frame:
    at: float  # wall clock of the scrape
    scrapes: list[tuple[Target, Scrape | str]]  # each process's samples, or why they could not be read

    def of(self, kind: str) -> list[tuple[Target, Scrape]]:
        return [(t, s) for t, s in self.scrapes if t.kind == kind and isinstance(s, Scrape)]

    def summed(self, kind: str, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """`name` by the labels `keys`, over every process of a kind (the bridges, the workers)."""
        out: dict[tuple[str, ...], float] = {}
        for _, scrape in self.of(kind):
            for key, v in scrape.by(name, *keys).items():
                out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, kind: str, name: str, *keys: str) -> dict[tuple[str, ...], dict[float, float]]:
        out: dict[tuple[str, ...], dict[float, float]] = {}
        for _, scrape in self.of(kind):
            for key, buckets in scrape.buckets_by(name, *keys).items():
                acc = out.setdefault(key, {})
                for le, count in buckets:
                    acc[le] = acc.get(le, 0.0) + count
        return out


def _with_totals(values: dict[tuple[str, ...], float]) -> dict[tuple[str, str], float]:
    """(class, tenant) values plus a (class, ALL) row each."""
    out: dict[tuple[str, str], float] = {}
    for (klass, tenant), v in values.items():
        out[(klass, tenant)] = out.get((klass, tenant), 0.0) + v
        out[(klass, ALL)] = out.get((klass, ALL), 0.0) + v
    return out


def _ttft_p95(now: Frame, before: Frame | None) -> dict[tuple[str, str], float]:
    after = now.buckets("bridge", "laneway_ttft_seconds", "class", "tenant")
    prior = before.buckets("bridge", "laneway_ttft_seconds", "class", "tenant") if before else {}
    rows: dict[tuple[str, str], dict[float, float]] = {}
    for key, buckets in after.items():
        delta = bucket_delta(sorted(buckets.items()), sorted(prior.get(key, {}).items()))
        for row in ((key[0], key[1]), (key[0], ALL)):
            acc = rows.setdefault(row, {})
            for le, count in delta:
                acc[le] = acc.get(le, 0.0) + count
    return {row: histogram_quantile(sorted(acc.items()), 0.95) for row, acc in rows.items()}


def _num(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.0f}"


def _seconds(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first two columns (names), right-aligned numbers."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines


def lanes(now: Frame, before: Frame | None) -> list[str]:
    waiting = _with_totals(now.summed("broker", "laneway_tenant_queue_depth", "class", "tenant"))
    running = _with_totals(now.summed("worker", "laneway_worker_running", "class", "tenant"))
    refused = _with_totals(now.summed("bridge", "laneway_refused_total", "class", "tenant"))
    ttft = _ttft_p95(now, before)
    keys = set(waiting) | set(running) | set(refused) | set(ttft)
    rows = []
    for klass in sorted({k for k, _ in keys}):
        tenants = sorted(t for k, t in keys if k == klass and t != ALL)
        for tenant in [ALL, *tenants]:
            key = (klass, tenant)
            rows.append(
                [
                    klass if tenant == ALL else "",
                    tenant,
                    _num(waiting.get(key, 0.0)),
                    _num(running.get(key, 0.0)),
                    _seconds(ttft.get(key)),
                    _num(refused.get(key, 0.0)),
                ]
            )
    window = f"last {now.at - before.at:.0f} s" if before else "since start"
    header = ["CLASS", "TENANT", "WAITING", "RUNNING", f"TTFT p95 ({window})", "REFUSED"]
    return _table(header, rows) if rows else [*_table(header, []), "  (no request seen yet)"]


def workers(now: Frame) -> list[str]:
    rows = []
    for target, s in now.of("worker"):
        pool = next(iter(s.by("laneway_worker_slots_total", "pool")), ("?",))[0]
        kv = s.total("laneway_worker_kv_tokens")
        rows.append(
            [
                target.name,
                pool,
                f"{_num(s.total('laneway_worker_slots_in_use'))}/{_num(s.total('laneway_worker_slots_total'))}",
                _share(max(0.0, kv - s.total("laneway_worker_kv_free_tokens")), kv),
                _share(
                    s.total("laneway_worker_cached_prompt_tokens_total"), s.total("laneway_worker_prompt_tokens_total")
                ),
                _num(s.total("laneway_worker_tokens_total")),
            ]
        )
    return _table(["WORKER", "POOL", "SLOTS", "KV USED", "PREFIX HIT", "TOKENS OUT"], rows)


def bridges(now: Frame) -> list[str]:
    rows = []
    for target, s in now.of("bridge"):
        limit = s.value("laneway_stream_limit")
        rows.append(
            [
                target.name,
                target.address,
                _num(s.total("laneway_open_streams")),
                _num(limit) if limit > 0 else "off",
                _num(s.total("laneway_edge_rejected_total")),
                _seconds(s.value("laneway_event_loop_lag_seconds")),
            ]
        )
    return _table(["BRIDGE", "ADDRESS", "STREAMS", "STREAM LIMIT", "REFUSED AT EDGE", "LOOP LAG"], rows)


def brokers(now: Frame) -> list[str]:
    rows = [
        [
            target.name,
            "yes" if s.value("laneway_broker_scheduler") == 1 else "no",
            _num(s.total("laneway_queue_depth")),
            _num(s.total("laneway_ready_workers")),
            _num(s.total("laneway_rejected_total")),
        ]
        for target, s in now.of("broker")
    ]
    return _table(["BROKER", "SCHEDULER", "WAITING", "READY WORKERS", "REFUSED"], rows)


def render(now: Frame, before: Frame | None = None, source: str = "") -> str:
    """One frame as plain text: the same lines on a terminal and in `--once`."""
    clock = time.strftime("%H:%M:%S", time.localtime(now.at))
    lines = [f"laneway top  {clock}  {len(now.scrapes)} processes{f'  from {source}' if source else ''}", ""]
    lines += [*lanes(now, before), "", *workers(now), "", *bridges(now), "", *brokers(now)]
    down = [f"  {t.name} ({t.url}): {why}" for t, why in now.scrapes if isinstance(why, str)]
    if down:
        lines += ["", "not answering:", *down]
    return "\n".join(lines) + "\n"
