"""`laneway routing show|set|rollback|history`: the routing rules in NATS KV, from a terminal.

    laneway routing show [--json]
    laneway routing set FILE [--force-reason R] [--scores S.json | --base-url URL --api-key KEY]
    laneway routing rollback N [--reason R]
    laneway routing history

Talks to NATS directly (`--nats-url`, `--prefix`), and `set` goes through the same eval gate as
`POST /v1/admin/routing` (`bridge/admin.change_rules`): it scores the candidate from
saved golden-set answers (`--scores`) or a running bridge (`--base-url`); with neither it can
only apply the change with `--force-reason`, which is recorded with the new version.
Exit status: 0 done, 2 invalid input, 3 refused by the gate, 4 version conflict, 5 no such version.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path

from core import env
from laneway.flags import ops_nats_flags


def configure(parser: argparse.ArgumentParser) -> None:
    ops_nats_flags(parser)
    sub = parser.add_subparsers(dest="routing_command", required=True)
    p = sub.add_parser("show", help="the current rule set and its version")
    p.add_argument("--json", action="store_true", help="only the rule set document")
    p = sub.add_parser("set", help="validate, evaluate, gate and store a rule set")
    p.add_argument("file", type=Path, help="rule set JSON")
    p.add_argument("--force-reason", help="apply even if the eval gate refuses; recorded with the version")
    p.add_argument("--expected-version", type=int, help="refuse if the current version is not this one")
    p.add_argument("--author", default=env.ADMIN_NAME.get() or _user())
    p.add_argument("--reason", help="why (overrides the file's `reason`)")
    p.add_argument("--scores", type=Path, help="saved golden-set answers per pool (laneway eval --save-scores)")
    p.add_argument("--base-url", help="a running bridge, to get missing golden-set answers")
    p.add_argument("--api-key", default=env.API_KEY.get(), help=f"[{env.API_KEY.name}]")
    p.add_argument("--pool-model", action="append", default=[], metavar="POOL=MODEL")
    p = sub.add_parser("rollback", help="make an earlier version current again (as a new version)")
    p.add_argument("version", type=int)
    p.add_argument("--reason", default="")
    p.add_argument("--author", default=env.ADMIN_NAME.get() or _user())
    p.add_argument("--expected-version", type=int)
    sub.add_parser("history", help="every version, oldest first")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


async def run(args: argparse.Namespace) -> int:
    from core.routing.store import VersionConflict, VersionNotFound, connect_store

    try:
        async with connect_store(args.nats_url, args.prefix, args.nats_user, args.nats_password) as store:
            if args.routing_command == "show":
                return await _show(store, args)
            if args.routing_command == "set":
                return await _set(store, args)
            if args.routing_command == "rollback":
                stored = await store.rollback(args.version, args.author, args.reason, args.expected_version)
                print(f"version {stored.version} now current (the rules of version {args.version})")
                return 0
            return await _history(store)
    except VersionConflict as exc:
        print(f"conflict: {exc}; read the current rules and retry", file=sys.stderr)
        return 4
    except VersionNotFound as exc:
        print(str(exc), file=sys.stderr)
        return 5


async def _show(store, args: argparse.Namespace) -> int:
    from core.routing.rules import encode

    current = await store.get_current()
    if current is None:
        print("no routing rules stored yet", file=sys.stderr)
        return 0
    if not args.json:
        print(
            f"version {current.version} by {current.author or '?'} at {_when(current.created_at)}: "
            f"{current.reason or '(no reason given)'}"
        )
    print(json.dumps(json.loads(encode(current)), indent=2))
    return 0


async def _set(store, args: argparse.Namespace) -> int:
    import msgspec

    from bridge.admin import GateRefused, change_rules
    from core.routing.rules import RuleSetError, decode

    try:
        candidate = decode(args.file.read_bytes())
    except (OSError, RuleSetError) as exc:
        print(f"invalid rule set {args.file}: {exc}", file=sys.stderr)
        return 2
    candidate = msgspec.structs.replace(
        candidate, author=args.author, reason=args.reason or candidate.reason, version=0, rollback_of=None, gate=None
    )
    evaluator = _evaluator(args) if (args.scores or args.base_url) else None
    try:
        applied = await change_rules(store, candidate, evaluator, args.expected_version, args.force_reason)
    except GateRefused as exc:
        print(f"refused by the eval gate: {exc.verdict.message}", file=sys.stderr)
        return 3
    v = applied.verdict
    print(f"stored version {applied.stored.version}; gate: {'FORCED' if v.forced else 'PASS'} — {v.message}")
    return 0


def _evaluator(args: argparse.Namespace):
    from core.routing.eval_gate import EvalOutcome, assess, load_golden, load_results, pools_needed
    from laneway.ops_eval import collect, parse_pool_models

    golden = load_golden()
    saved = load_results(args.scores) if args.scores else {}

    async def evaluate(candidate, current) -> EvalOutcome:
        needed = pools_needed(candidate, golden) | (pools_needed(current, golden) if current else set())
        results = await collect(golden, needed, saved, args.base_url, args.api_key, parse_pool_models(args.pool_model))
        return EvalOutcome(assess(candidate, golden, results), assess(current, golden, results) if current else None)

    return evaluate


async def _history(store) -> int:
    versions = await store.history()
    if not versions:
        print("no routing rules stored yet")
        return 0
    print(f"{'ver':>4}  {'created (UTC)':19}  {'author':14} {'quality':>8}  note")
    for rs in versions:
        g = rs.gate
        quality = f"{g.candidate_quality:.2f}" if g and g.candidate_quality is not None else "-"
        notes = [rs.reason] if rs.reason else []
        if rs.rollback_of is not None:
            notes.insert(0, f"rollback of v{rs.rollback_of}")
        if g and g.forced_reason:
            notes.append(f"FORCED: {g.forced_reason}")
        print(f"{rs.version:>4}  {_when(rs.created_at):19}  {rs.author[:14]:14} {quality:>8}  {'; '.join(notes)}")
    return 0


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "-"
