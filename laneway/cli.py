"""The `laneway` command's parser and entry point.

With `flags.py` this is the one place that reads the command line and the environment (through
`core/env.py`); `processes.py` runs what it names. Each tool module gives `configure(parser)` and
`run(args)` (`run_sync` when it needs no event loop). What users read is `DESCRIPTION` and each
subcommand's help: no file names of this repository in them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from nats.errors import NoServersError

from core import env
from core.tracing import configure as configure_tracing
from laneway import processes
from laneway.flags import (
    NoNats,
    add_nats_flags,
    at_least_one,
    edge_flags,
    find_stack,
    gate_flags,
    limits_flags,
    metrics_flag,
    ops_nats_flags,
    unreachable,
)

log = logging.getLogger("laneway")

DESCRIPTION = """\
Laneway serves OpenAI-compatible LLM requests through NATS JetStream: an HTTP bridge, a broker
that schedules priority classes and tenants fairly, and workers that run the engines.

Start here:
  laneway up                    everything on this machine (NATS, broker, worker, bridge)
  laneway top                   a live view of the lanes, workers and bridges
  laneway batches watch ID      follow a batch: a progress bar until it ends
  laneway files list            a tenant's files (batch inputs, outputs, errors)

Each command's own --help says more: laneway COMMAND --help
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="laneway", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log-level", default=env.LOG_LEVEL.get(), help=f"[{env.LOG_LEVEL.name}]")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(subcommands=sub.choices)

    p = sub.add_parser("up", help="run nats-server, broker, a worker and the bridge here")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--data-dir", default=env.DATA_DIR.get())
    p.add_argument(
        "--api-key", default=env.API_KEY.get(), help="the demo tenant's key (generated and printed if absent)"
    )
    p.add_argument(
        "--nats-port",
        type=int,
        default=0,
        help="0: the port of the last run on this data dir while it is free, else a free one "
        "(kept in DATA_DIR/nats-port)",
    )
    p.add_argument("--settings", help="settings TOML (tenants, models) instead of the demo tenant")
    p.add_argument("--engine", choices=("sim", "vllm", "openai"), default="sim")
    p.add_argument("--model", help="model directory for --engine vllm")
    p.add_argument("--model-name", help="the logical model clients name (default: by engine)")
    p.add_argument("--pool", default=None)
    p.add_argument(
        "--pii",
        choices=("off", "auto", "regex", "ner"),
        default="auto",
        help="the broker's PII stage (auto: Presidio if installed)",
    )
    p.add_argument(
        "--no-nats-auth",
        action="store_true",
        help="run nats-server without users (default: one user per service and tenant, "
        "passwords in DATA_DIR/nats-credentials.json)",
    )
    p.add_argument(
        "--no-encrypt-at-rest",
        action="store_true",
        help="store JetStream in plaintext (default: encrypted, key in DATA_DIR/nats/jetstream.key)",
    )
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument(
        "--brokers",
        type=at_least_one,
        default=1,
        help="broker processes (they share the request stream; each is restarted alone)",
    )
    p.add_argument("--workers", type=at_least_one, default=1, help="worker processes of the pool")
    p.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every broker and worker serves Prometheus metrics on a free loopback port of "
        "its own, listed with the bridge's in DATA_DIR/prometheus.yml (on by default; "
        "the bridge serves /metrics anyway)",
    )
    p.set_defaults(run=processes.run_up)

    p = sub.add_parser("nats", help="an embedded nats-server with JetStream")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--nats-port", type=int, default=4222)
    p.add_argument("--data-dir", default=env.DATA_DIR.get())
    p.add_argument("--config", help="a nats-server config, e.g. from `laneway nats-config`")
    p.set_defaults(run=processes.run_nats)

    p = sub.add_parser("broker", help="the scheduler")
    add_nats_flags(p)
    limits_flags(p)
    metrics_flag(p)
    gate_flags(p)
    p.set_defaults(run=processes.run_broker)

    p = sub.add_parser("worker", help="one engine in a pool")
    add_nats_flags(p)
    metrics_flag(p)
    p.add_argument("--pool", default="default")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--classes", nargs="*", help="classes this worker takes (default: all)")
    p.add_argument("--heartbeat-interval", type=float, default=2.0)
    p.add_argument(
        "--in-progress-interval",
        type=float,
        default=5.0,
        help="seconds between in-progress acks; keep well under the broker's --ack-wait",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may take to finish"
    )
    p.add_argument(
        "--frame-interval",
        type=float,
        default=0.002,
        help="seconds between token frames at most (engine steps faster than this coalesce)",
    )
    from laneway import engines

    engines.configure_all(p)
    p.set_defaults(run=processes.run_worker)

    p = sub.add_parser("bridge", help="the OpenAI-compatible HTTP edge")
    add_nats_flags(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--settings",
        default=env.SETTINGS.get(),
        help="settings TOML (its default timeout; `laneway ops provision` puts its "
        "tenants and models into KV) [LANEWAY_SETTINGS]",
    )
    p.add_argument(
        "--eval-scores",
        help="golden-set answers per pool (from `laneway eval "
        "--save-scores`): the admin API's eval gate scores rule changes with them",
    )
    edge_flags(p)
    p.set_defaults(run=processes.run_bridge)

    # Tools: a module's configure(parser) and run(args), run_sync when it needs no event loop.
    from laneway import nats_config, ops_config, ops_provision, ops_routing, top
    from laneway import ops_usage as usage_report

    p = sub.add_parser("ops", help="operator one-shots: provision")
    ops_sub = p.add_subparsers(dest="ops_command", required=True)
    p = ops_sub.add_parser(
        "provision",
        help="streams, buckets and the settings file into KV (create-if-absent), then exit: run it before the services",
    )
    ops_nats_flags(p)
    limits_flags(p)
    ops_provision.configure(p)
    p.set_defaults(run_sync=processes.run_provision)
    from laneway import ops_eval
    from loadtest import generator, planner

    def tool(name: str, help: str, configure, run, *, sync: bool) -> None:
        p = sub.add_parser(name, help=help)
        configure(p)
        p.set_defaults(**{"run_sync" if sync else "run": run})

    tool(
        "nats-config",
        "nats-server config with a user per tenant and service",
        nats_config.configure,
        nats_config.run,
        sync=True,
    )
    tool(
        "routing",
        "show, set, roll back the routing rules (live, versioned)",
        ops_routing.configure,
        ops_routing.run,
        sync=False,
    )
    tool(
        "eval",
        "golden-set quality and cost of candidate vs current rules",
        ops_eval.configure,
        ops_eval.run,
        sync=False,
    )
    tool("classes", "list or change priority classes, live", ops_config.configure_classes, ops_config.run, sync=True)
    tool("tenants", "list or change tenants, live", ops_config.configure_tenants, ops_config.run, sync=True)

    def usage_flags(p: argparse.ArgumentParser) -> None:
        ops_nats_flags(p)
        usage_report.configure(p)

    tool("usage", "a tenant's metered usage from LW_USAGE (table or CSV)", usage_flags, usage_report.run, sync=True)
    tool("top", "a live view of the lanes, workers and bridges, from their metrics", top.configure, top.run, sync=False)
    tool(
        "loadtest",
        "load generator: named scenarios, open or closed loop",
        generator.configure,
        generator.run,
        sync=True,
    )
    tool("plan", "capacity and budget planner", planner.configure, planner.run, sync=True)
    from laneway import ops_batches, ops_files

    tool(
        "batches",
        "list, watch, cancel and download a tenant's batches (the bridge's Batch API)",
        ops_batches.configure,
        ops_batches.run,
        sync=True,
    )
    tool(
        "files",
        "list, upload, download and delete a tenant's files (the bridge's Files API)",
        ops_files.configure,
        ops_files.run,
        sync=True,
    )

    p = sub.add_parser("model", help="model preparation")
    model_sub = p.add_subparsers(dest="model_command", required=True)
    from laneway import model_prepare

    mp = model_sub.add_parser("prepare", help="prepare a real small model for the vLLM engine")
    model_prepare.configure(mp)
    mp.set_defaults(run_sync=model_prepare.run)
    return parser


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # Windows, or a minimal install: asyncio's own loop works too
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


TRACED = ("bridge", "broker", "worker")  # the processes a request's trace crosses


def _operator_command(args: argparse.Namespace) -> int:
    """A one-shot operator command: NATS as its flags or the environment say, else the stack
    running on its --data-dir; a missing or unreachable NATS is one line that says what to do,
    never a traceback."""
    try:
        find_stack(args)
        if hasattr(args, "run_sync"):
            return args.run_sync(args)
        _install_uvloop()
        return asyncio.run(args.run(args))
    except NoNats as exc:
        print(f"laneway {args.command}: {exc}", file=sys.stderr)
        return 2
    except NoServersError as exc:
        print(f"laneway {args.command}: {unreachable(args, exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, forwarded = parser.parse_known_args(argv)
    if forwarded and args.command != "up":
        parser.error(f"unrecognized arguments: {' '.join(forwarded)}")
    routed: dict[str, list[str]] = {}  # `up`'s flags for each of its children
    if args.command == "up":
        from laneway.up_flags import ROLES, FlagError, route_flags

        try:
            routed = route_flags(forwarded, {role: args.subcommands[role] for role in ROLES})
        except FlagError as exc:
            parser.error(f"up: {exc}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "find_stack", False):
        return _operator_command(args)
    if hasattr(args, "run_sync"):
        return args.run_sync(args)
    _install_uvloop()
    run: Callable[..., Coroutine[Any, Any, int]] = args.run
    # The standard OpenTelemetry variable; unset, tracing stays off and costs nothing.
    tracing = configure_tracing(f"laneway-{args.command}", env.OTEL_ENDPOINT.get() if args.command in TRACED else None)
    try:
        if args.command == "up":
            return asyncio.run(run(args, routed))
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    finally:
        tracing.shutdown()  # exports the spans still batched


if __name__ == "__main__":
    sys.exit(main())
