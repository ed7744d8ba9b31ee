"""`laneway eval`: the golden set through a running bridge, candidate vs current rules side by side.

    laneway eval --rules candidate.json --base-url http://127.0.0.1:8080 --api-key KEY \\
                 --pool-model small=pool-small --pool-model large=pool-large [--save-scores s.json]
    laneway eval --rules candidate.json --scores s.json             # no traffic: saved answers

Each pool a rule set can route golden prompts to answers them once, through the logical model
pinned to it (`--pool-model POOL=MODEL`; default a model named like the pool); the rule sets are
then scored from those answers (see `core/routing/eval_gate.py`). Exit status: 0 the gate passes,
3 it would block the change, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from core import env
from core.policy.cascade import cascade_report, format_report, pick_threshold
from core.routing.eval_gate import (
    GOLDEN_PATH,
    MAX_DROP,
    Completer,
    Completion,
    EvalOutcome,
    EvalUnavailable,
    GoldenItem,
    PoolResults,
    assess,
    cascade_samples,
    format_side_by_side,
    gate,
    load_golden,
    load_results,
    pools_needed,
    run_pools,
    save_results,
)
from core.routing.rules import RuleSet, RuleSetError, decode
from laneway.flags import ops_nats_flags


def http_completer(
    session: aiohttp.ClientSession, base_url: str, api_key: str, pool_models: Mapping[str, str], logprobs: bool = False
) -> Completer:
    """Asks a running bridge: `pool_models[pool]` is the logical model pinned to that pool
    (default: a model named like the pool). Greedy decoding, so reruns give the same answers."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"}

    async def complete(pool: str, item: GoldenItem) -> Completion:
        body: dict = {
            "model": pool_models.get(pool, pool),
            "temperature": 0,
            "max_tokens": item.max_tokens,
            "messages": [{"role": "user", "content": item.prompt}],
        }
        if logprobs:
            body["logprobs"] = True
        async with session.post(url, json=body, headers=headers) as response:
            doc = await response.json(content_type=None)
            if response.status != 200:
                message = (doc.get("error") or {}).get("message", "") if isinstance(doc, dict) else ""
                raise EvalUnavailable(f"pool {pool!r} answered {response.status}: {message}", pool)
        choice = doc["choices"][0]
        usage = doc.get("usage") or {}
        lp = (choice.get("logprobs") or {}).get("content") or None
        return Completion(
            choice["message"]["content"] or "",
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
            [t["logprob"] for t in lp] if lp else None,
        )

    return complete


def configure(parser: argparse.ArgumentParser) -> None:
    ops_nats_flags(parser)
    parser.add_argument("--rules", required=True, type=Path, help="candidate rule set (JSON)")
    parser.add_argument("--baseline", type=Path, help="compare with this file instead of the stored rules")
    parser.add_argument("--golden", type=Path, default=GOLDEN_PATH)
    parser.add_argument("--base-url", help="a running bridge, to get pool answers for the golden set")
    parser.add_argument("--api-key", default=env.API_KEY.get(), help="a tenant key for --base-url [LANEWAY_API_KEY]")
    parser.add_argument(
        "--pool-model",
        action="append",
        default=[],
        metavar="POOL=MODEL",
        help="the logical model pinned to POOL (default: the pool's own name)",
    )
    parser.add_argument("--logprobs", action="store_true", help="ask pools for logprobs (cascade scoring)")
    parser.add_argument("--scores", type=Path, help="saved pool answers to reuse (from --save-scores)")
    parser.add_argument("--save-scores", type=Path, help="write the pool answers used here")
    parser.add_argument("--cascade", metavar="SMALL:LARGE", help="also report the cascade between two pools")
    parser.add_argument("--force-reason", help="show the gate verdict as if forced with this reason")


async def collect(
    golden: list[GoldenItem],
    pools: set[str],
    results: PoolResults,
    base_url: str | None,
    api_key: str | None,
    pool_models: Mapping[str, str],
    logprobs: bool = False,
) -> PoolResults:
    """`results` completed with answers from every pool in `pools` that lacks some."""
    missing = sorted(p for p in pools if len(results.get(p, {})) < len(golden))
    if not missing:
        return results
    if not (base_url and api_key):
        raise EvalUnavailable(
            f"no golden-set answers for pools {missing}: pass --base-url and --api-key (or --scores FILE)"
        )
    async with aiohttp.ClientSession() as session:
        fresh = await run_pools(golden, missing, http_completer(session, base_url, api_key, pool_models, logprobs))
    return {**results, **fresh}


async def run(args: argparse.Namespace) -> int:
    golden = load_golden(args.golden)
    try:
        candidate = decode(args.rules.read_bytes())
        baseline = decode(args.baseline.read_bytes()) if args.baseline else await _stored(args)
    except RuleSetError as exc:
        print(f"invalid rule set: {exc}", file=sys.stderr)
        return 2
    needed = pools_needed(candidate, golden) | (pools_needed(baseline, golden) if baseline else set())
    if args.cascade:
        needed |= set(args.cascade.split(":", 1))
    try:
        results = await collect(
            golden,
            needed,
            load_results(args.scores) if args.scores else {},
            args.base_url,
            args.api_key,
            parse_pool_models(args.pool_model),
            args.logprobs,
        )
    except EvalUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.save_scores:
        save_results(args.save_scores, results)
    outcome = EvalOutcome(assess(candidate, golden, results), assess(baseline, golden, results) if baseline else None)
    verdict = gate(outcome.candidate.quality, outcome.baseline.quality if outcome.baseline else None, args.force_reason)
    print(format_side_by_side(outcome, verdict, len(golden)))
    if args.cascade:
        small, large = args.cascade.split(":", 1)
        samples = cascade_samples(golden, results, small, large, candidate)
        print(format_report(cascade_report(samples, candidate.cascade)))
        best = pick_threshold(samples, candidate.cascade, [-x / 10 for x in range(1, 31)])
        print(
            f"best threshold within {MAX_DROP:g} pt of always-large: "
            + (f"{best.threshold:.2f} (kept off large {100 * best.kept_off_large:.1f}%)" if best else "none")
        )
    return 0 if verdict.allowed else 3


def parse_pool_models(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        pool, sep, model = pair.partition("=")
        if not sep or not pool or not model:
            raise SystemExit(f"--pool-model expects POOL=MODEL, got {pair!r}")
        out[pool] = model
    return out


async def _stored(args: argparse.Namespace) -> RuleSet | None:
    from core.routing.store import connect_store

    async with connect_store(args.nats_url, args.prefix, args.nats_user, args.nats_password) as store:
        return await store.get_current()
