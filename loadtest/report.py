"""Results JSON → PNG plots and ONE self-contained HTML page (the PNGs embedded as base64).

    python -m loadtest.report results.json --html report.html [--png-dir plots/]

Reads what `loadtest.generator` and the benchmarks (`hol`, `fairness`, `scale`) write: a
document with `runs` (one per scenario run or benchmark phase). Plots: TTFT CDF per class
(per run), throughput (tokens/s per flow) over time, and queue depth over time: requests in
flight per flow, those still waiting for their first token, and the bridge's open streams.
Needs matplotlib (the `loadtest` extra).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def ttft_cdf(doc: dict) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    runs = doc["runs"]
    for run in runs:
        for klass, values in run["ttft_samples"].items():
            if not values:
                continue
            xs = [v * 1000 for v in values]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            label = klass if len(runs) == 1 else f"{run['label']} · {klass}"
            ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")
    slo = doc.get("slo", {}).get("ttft_s", 0.8) * 1000
    ax.axvline(slo, color="grey", linestyle=":", label=f"SLO {slo:.0f} ms")
    ax.axhline(0.95, color="lightgrey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per class (engine: SIMULATION)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    data = _png(fig)
    plt.close(fig)
    return data


def _colours(doc: dict) -> dict[str, str]:
    """One colour per flow across every run, so phases read alike."""
    flows = sorted(
        {f for run in doc["runs"] for f in run["timeline"]["inflight"]}
        | {f for run in doc["runs"] for f in run["timeline"]["tokens_per_s"]}
    )
    return {f: f"C{i % 10}" for i, f in enumerate(flows)}


def _per_run_axes(plt, n: int):
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.8 * n + 0.6), squeeze=False, sharex=False)
    return fig, [a[0] for a in axes]


def throughput(doc: dict) -> bytes:
    plt = _pyplot()
    fig, axes = _per_run_axes(plt, len(doc["runs"]))
    colour = _colours(doc)
    for ax, run in zip(axes, doc["runs"], strict=True):
        tl = run["timeline"]
        for flow, series in tl["tokens_per_s"].items():
            ax.plot(tl["t"], series, label=flow, color=colour[flow])
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{run['label']}: throughput", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("seconds since start")
    fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data


def queue_depth(doc: dict) -> bytes:
    plt = _pyplot()
    fig, axes = _per_run_axes(plt, len(doc["runs"]))
    colour = _colours(doc)
    for ax, run in zip(axes, doc["runs"], strict=True):
        tl = run["timeline"]
        t = tl["sample_t"]
        for flow, series in tl["inflight"].items():
            (line,) = ax.plot(t, series, label=f"{flow} in flight", color=colour[flow])
            ax.plot(
                t,
                tl["waiting"].get(flow, []),
                linestyle="--",
                color=line.get_color(),
                label=f"{flow} waiting for 1st token",
            )
        if tl.get("open_streams"):
            ax.plot(
                t,
                [math.nan if v is None else v for v in tl["open_streams"]],
                color="black",
                linewidth=0.8,
                label="bridge open streams",
            )
        ax.set_ylabel("requests")
        ax.set_title(f"{run['label']}: queue depth", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds since start")
    fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data


PLOTS = {"ttft_cdf": ttft_cdf, "throughput": throughput, "queue_depth": queue_depth}


def _ms(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.1f}"


def _table(run: dict) -> str:
    rows = []
    for title, key in (("class", "by_class"), ("tenant", "by_tenant"), ("flow", "by_flow")):
        for name, g in run[key].items():
            errs = ", ".join(f"{k}: {v}" for k, v in g["errors"].items()) or "0"
            s = g["slo"]
            rows.append(
                "<tr>"
                + "".join(
                    f"<td>{html.escape(str(c))}</td>"
                    for c in (
                        title,
                        name,
                        g["requests"],
                        errs,
                        _ms(g["ttft_s"]["p50"]),
                        _ms(g["ttft_s"]["p95"]),
                        _ms(g["ttft_s"]["p99"]),
                        _ms(g["itl_s"]["p50"]),
                        _ms(g["itl_s"]["p95"]),
                        _ms(g["itl_s"]["p99"]),
                        _ms(g["e2e_s"]["p50"]),
                        _ms(g["e2e_s"]["p95"]),
                        _ms(g["e2e_s"]["p99"]),
                        f"{g['tokens_per_s']:,.0f}",
                        f"{(s['ttft_800ms']['attainment'] or 0) * 100:.1f}%",
                        f"{(s['latency_1s']['attainment'] or 0) * 100:.1f}%",
                    )
                )
                + "</tr>"
            )
    head = (
        "<tr><th>by</th><th>group</th><th>requests</th><th>errors</th>"
        "<th>TTFT p50</th><th>p95</th><th>p99</th><th>ITL p50</th><th>p95</th><th>p99</th>"
        "<th>e2e p50</th><th>p95</th><th>p99</th><th>tokens/s</th><th>TTFT&lt;800ms</th>"
        "<th>TTFT&lt;1s</th></tr>"
    )
    return f"<h3>{html.escape(run['label'])}</h3><table>{head}{''.join(rows)}</table>"


def render_html(doc: dict, images: dict[str, bytes]) -> str:
    title = doc.get("scenario") or doc.get("benchmark") or "Laneway load test"
    headline = "".join(f"<li>{html.escape(line)}</li>" for line in doc.get("headline", []))
    imgs = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{name.replace('_', ' ')}</figcaption></figure>"
        for name, png in images.items()
    )
    engine = doc.get("engine")
    engine_text = json.dumps(engine) if isinstance(engine, dict) else str(engine)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Laneway: {html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:12px;margin-bottom:1.5em}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:nth-child(-n+2){{text-align:left}}
img{{max-width:100%}}.sim{{background:#fff3cd;padding:.5em 1em}}</style></head><body>
<h1>Laneway: {html.escape(title)}</h1>
<p>{html.escape(doc.get("description", ""))}</p>
<p class="sim">Engine: SIMULATION (modelled GPU step times, no real model). {html.escape(engine_text)}</p>
{f"<ul>{headline}</ul>" if headline else ""}
{imgs}
<h2>Figures (latencies in ms)</h2>
{"".join(_table(run) for run in doc["runs"])}
</body></html>
"""


def write(doc: dict, html_path: Path, png_dir: Path | None = None) -> dict[str, Path]:
    """Render every plot; write the PNGs (next to the page unless `png_dir`) and the page."""
    images = {name: plot(doc) for name, plot in PLOTS.items()}
    png_dir = png_dir or html_path.parent / f"{html_path.stem}_png"
    png_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in images.items():
        paths[name] = png_dir / f"{name}.png"
        paths[name].write_bytes(data)
    html_path.write_text(render_html(doc, images))
    return paths


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="JSON written by the generator or a benchmark")
    parser.add_argument("--html", type=Path, default=None, help="the page (default: results with .html)")
    parser.add_argument("--png-dir", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    doc = json.loads(args.results.read_text())
    out = args.html or args.results.with_suffix(".html")
    paths = write(doc, out, args.png_dir)
    print(f"report: {out}")
    for path in paths.values():
        print(f"plot:   {path}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(p)
    sys.exit(run(p.parse_args()))
