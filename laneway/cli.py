"""The `laneway` command. The one place that reads the environment and the command line.

  laneway up        nats-server + broker + worker + bridge on this machine, one command
  laneway nats      an embedded nats-server with JetStream
  laneway nats-config   users and permissions per tenant and service role
  laneway broker    the scheduler (joins any NATS via --nats-url)
  laneway worker    one engine (sim | vllm | openai) in a pool
  laneway bridge    the OpenAI-compatible HTTP edge
  laneway ops provision   streams, buckets, the settings file into KV (compose, Kubernetes)
  laneway classes   list | set: priority classes, live
  laneway tenants   list | set: tenants, live
  laneway routing   show | set | rollback | history of the routing rules
  laneway eval      the eval gate: candidate vs current rules on the golden set
  laneway usage     a tenant's metered usage (tokens, cost)
  laneway loadtest  the load generator (scenarios from the reference designs)
  laneway plan      the capacity and budget planner
  laneway model prepare NAME DIR   a real small model for the vLLM engine, offline
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from broker.runtime import heap
from broker.runtime.connect import add_nats_flags, nats_from_args
from broker.runtime.tracing import configure as configure_tracing

log = logging.getLogger("laneway")


# The bridge's HMAC key for Idempotency-Key request ids: in the environment only, never argv.
IDEMPOTENCY_SECRET_ENV = "LANEWAY_IDEMPOTENCY_SECRET"


# -- shared flags ---------------------------------------------------------------------------
_nats_flags = add_nats_flags
_nats = nats_from_args


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def _limits_flags(parser: argparse.ArgumentParser) -> None:
    from broker.config import StreamLimits

    d = StreamLimits()
    g = parser.add_argument_group("request stream (LW_REQ)")
    g.add_argument("--backlog-per-tenant", type=int, default=d.max_msgs_per_subject,
                   help="queued + running requests per (class, tenant); beyond it: 429")
    g.add_argument("--ack-wait", type=float, default=d.ack_wait_s,
                   help="seconds before an unacknowledged request is redelivered")
    g.add_argument("--max-deliver", type=int, default=d.max_deliver)
    g.add_argument("--max-stream-gib", type=_positive_float, default=d.max_bytes / 1024**3,
                   help="GiB the queued requests may take; JetStream reserves it on disk when the "
                        "stream is created, and a full stream refuses new requests (503)")
    g.add_argument("--replicas", type=int, default=d.replicas, help="stream replicas (3 on a cluster)")
    g.add_argument("--dlq-max-age-days", type=float, default=d.dlq_max_age_s / 86400,
                   help="days LW_DLQ keeps a dead-lettered request")


def stream_limits(args: argparse.Namespace):
    """The limits flags as `StreamLimits` (the broker's, and provisioning's: `ops provision`, `up`)."""
    from broker.config import StreamLimits

    return StreamLimits(max_msgs_per_subject=args.backlog_per_tenant, ack_wait_s=args.ack_wait,
                        max_deliver=args.max_deliver, replicas=args.replicas,
                        max_bytes=int(args.max_stream_gib * 1024**3),
                        dlq_max_age_s=args.dlq_max_age_days * 86400)


def _edge_flags(parser: argparse.ArgumentParser) -> None:
    from broker.config import BridgeConfig

    d = BridgeConfig()
    g = parser.add_argument_group("client limits")
    g.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                   help="seconds a connection may go without a whole request head (idle keep-alive too)")
    g.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                   help="seconds a request body may take to arrive; then 408")
    g.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="open connections at most; past it a connection gets 503 and is closed")
    g.add_argument("--max-streams", type=int, default=d.max_streams,
                   help="open streams at most (0: no cap); past it a request gets 503 before it is stored")
    g.add_argument("--max-delivery-lag", type=float, default=d.max_delivery_lag_s,
                   help="seconds late (smoothed) the bridge's token frames may run before it takes no "
                        "new stream (503) until it catches up; 0: off")
    g.add_argument("--tenant-max-streams", type=int, default=d.tenant_max_streams,
                   help="one tenant's open streams on this bridge at most (0: no cap); past it, 429 "
                        "before the request is stored")
    g.add_argument("--stream-buffer-bytes", type=int, default=d.stream_buffer_bytes,
                   help="bytes of one stream that may wait for a client that is not reading; past "
                        "it the stream ends with slow_reader and its generation is cancelled")
    g.add_argument("--tenant-buffer-bytes", type=int, default=d.tenant_buffer_bytes,
                   help="the same over all of one tenant's streams on this bridge")
    g.add_argument("--write-timeout", type=float, default=d.write_timeout_s,
                   help="seconds one SSE write may wait on a client that does not read; then the "
                        "connection is dropped and the generation cancelled (0: no limit)")
    _context_flag(g)
    g.add_argument("--publish-timeout", type=float, default=d.publish_timeout_s,
                   help="seconds to wait for JetStream to confirm a request before publishing it again "
                        "(same Nats-Msg-Id: stored once)")
    g.add_argument("--publish-tries", type=int, default=d.publish_tries,
                   help="publishes of one request before the client gets 503")


def _context_flag(group) -> None:
    """The bridge's and the broker's (it checks again what a direct publisher sends): `up` gives both the same."""
    from broker.config import DEFAULT_CONTEXT_TOKENS

    group.add_argument("--max-context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS,
                       help="the longest prompt for rule-routed models (models-table entries set their own)")


def _gate_flags(parser: argparse.ArgumentParser) -> None:
    from broker.config import DEFAULT_PII_MAX_CHARS
    from broker.gate.pii_service import MODES

    g = parser.add_argument_group("admission gate")
    g.add_argument("--pii", choices=MODES, default=os.environ.get("LANEWAY_PII", "auto"),
                   help="PII stage: auto = Presidio if installed (NER if its model is) [LANEWAY_PII]")
    g.add_argument("--pii-workers", type=int, default=None, help="PII process pool size")
    g.add_argument("--pii-max-chars", type=_at_least_one, default=DEFAULT_PII_MAX_CHARS,
                   help="the most text (characters) of one request the PII stage analyses; a request "
                        "with more is refused before analysis (413 pii_too_large)")
    g.add_argument("--no-quotas", action="store_true", help="do not enforce tenant quotas")
    g.add_argument("--cache-ttl", type=float, default=3600.0, help="response cache TTL; 0: off")
    _context_flag(g)


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def _metrics_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics on this port")
    # Loopback unless asked: the metrics carry tenant names and their traffic, and nothing but
    # a scraper in the same pod or network namespace should read them (the chart and compose
    # pass 0.0.0.0 behind their network policy / unpublished ports).
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address the metrics listener binds (default loopback only)")


def _serve_metrics(args: argparse.Namespace, registry) -> None:
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host, registry=registry)


async def _until_signalled(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# -- processes ------------------------------------------------------------------------------
async def _run_broker(args: argparse.Namespace) -> int:
    from broker.config import BrokerConfig
    from broker.dispatch import Broker

    broker = Broker(BrokerConfig(nats=_nats(args), limits=stream_limits(args), quotas=not args.no_quotas,
                                 cache_ttl_s=args.cache_ttl, pii=args.pii, pii_workers=args.pii_workers,
                                 pii_max_chars=args.pii_max_chars,
                                 max_context_tokens=args.max_context_tokens))
    _serve_metrics(args, broker.metrics.registry)
    async with broker:
        heap.settle()
        await _until_signalled(asyncio.Event())
    return 0


async def _run_worker(args: argparse.Namespace) -> int:
    from workers import engines
    from workers.runner import Worker, WorkerConfig

    engine = engines.build(args)
    config = WorkerConfig(nats=_nats(args), pool=args.pool, worker_id=args.worker_id or "",
                          classes=tuple(args.classes or ()), heartbeat_s=args.heartbeat_interval,
                          in_progress_s=args.in_progress_interval, drain_s=args.drain_timeout,
                          frame_interval_s=args.frame_interval)
    worker = Worker(config, engine)
    _serve_metrics(args, worker.metrics.registry)
    stop = asyncio.Event()
    signals = asyncio.create_task(_until_signalled(stop))
    await worker.start()
    heap.settle()
    done = asyncio.create_task(worker.wait())
    await asyncio.wait([signals, done], return_when=asyncio.FIRST_COMPLETED)
    await worker.stop()
    signals.cancel()
    return 1 if worker.dead is not None else 0


async def _run_bridge(args: argparse.Namespace) -> int:
    from broker.bridge.admin import AdminConfig
    from broker.bridge.app import Bridge
    from broker.config import BadSettings, BridgeConfig, load_serving_settings

    try:
        settings = load_serving_settings(Path(args.settings)) if args.settings else None
    except BadSettings as exc:
        print(f"laneway bridge: {exc}", file=sys.stderr)
        return 2
    from broker.config import MIN_SECRET_CHARS

    secret = os.environ.get(IDEMPOTENCY_SECRET_ENV, "")
    if len(secret) < MIN_SECRET_CHARS:
        # Never a default: every replica must derive the same request id from an Idempotency-Key.
        print(f"laneway bridge: ${IDEMPOTENCY_SECRET_ENV} is {'too short' if secret else 'not set'}: give "
              f"every bridge replica the same secret of at least {MIN_SECRET_CHARS} characters (e.g. "
              "`openssl rand -hex 32`); `laneway up` makes its own", file=sys.stderr)
        return 2
    evaluator = None
    if args.eval_scores:
        from broker.routing.eval_gate import load_golden, load_results, results_evaluator

        evaluator = results_evaluator(load_golden(), load_results(Path(args.eval_scores)))
    bridge = Bridge(BridgeConfig(nats=_nats(args), host=args.host, port=args.port,
                                 header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                                 max_connections=args.max_connections,
                                 max_streams=args.max_streams, max_delivery_lag_s=args.max_delivery_lag,
                                 tenant_max_streams=args.tenant_max_streams,
                                 stream_buffer_bytes=args.stream_buffer_bytes,
                                 tenant_buffer_bytes=args.tenant_buffer_bytes, write_timeout_s=args.write_timeout,
                                 max_context_tokens=args.max_context_tokens,
                                 publish_timeout_s=args.publish_timeout, publish_tries=args.publish_tries,
                                 idempotency_secret=secret),
                    settings,
                    admin=AdminConfig.from_env(), evaluator=evaluator)
    async with bridge:
        print(f"laneway bridge on {bridge.url}", flush=True)
        heap.settle()
        await _until_signalled(asyncio.Event())
    return 0


async def _run_nats(args: argparse.Namespace) -> int:
    from broker.runtime.natsd import NatsServer

    server = NatsServer(Path(args.data_dir) / "nats", host=args.host, port=args.nats_port,
                        config_file=Path(args.config) if args.config else None)
    async with server:
        print(f"nats-server with JetStream on {server.url} (store {server.store_dir})", flush=True)
        await _until_signalled(asyncio.Event())
    return 0


def _run_provision(args: argparse.Namespace) -> int:
    from laneway import ops_provision

    return ops_provision.run(args, stream_limits(args))


async def _run_up(args: argparse.Namespace, forwarded: dict[str, list[str]]) -> int:
    from laneway.up import up

    return await up(args, forwarded)


# -- parser ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laneway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default=os.environ.get("LANEWAY_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(subcommands=sub.choices)

    p = sub.add_parser("up", help="run nats-server, broker, a worker and the bridge here")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--data-dir", default=os.environ.get("LANEWAY_DATA_DIR", ".laneway"))
    p.add_argument("--api-key", default=os.environ.get("LANEWAY_API_KEY"),
                   help="the demo tenant's key (generated and printed if absent)")
    p.add_argument("--nats-port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--settings", help="settings TOML (tenants, models) instead of the demo tenant")
    p.add_argument("--engine", choices=("sim", "vllm", "openai"), default="sim")
    p.add_argument("--model", help="model directory for --engine vllm")
    p.add_argument("--model-name", help="the logical model clients name (default: by engine)")
    p.add_argument("--pool", default=None)
    p.add_argument("--pii", choices=("off", "auto", "regex", "ner"), default="auto",
                   help="the broker's PII stage (auto: Presidio if installed)")
    p.add_argument("--no-nats-auth", action="store_true",
                   help="run nats-server without users (default: one user per service and tenant, "
                        "passwords in DATA_DIR/nats-credentials.json)")
    p.add_argument("--no-encrypt-at-rest", action="store_true",
                   help="store JetStream in plaintext (default: encrypted, key in DATA_DIR/nats/jetstream.key)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--brokers", type=_at_least_one, default=1,
                   help="broker processes (they share the request stream; each is restarted alone)")
    p.add_argument("--workers", type=_at_least_one, default=1, help="worker processes of the pool")
    p.add_argument("--metrics", action="store_true",
                   help="every broker and worker serves Prometheus metrics on a free port of its own "
                        "(its --metrics-port, in `ps`; the bridge serves them at /metrics anyway)")
    p.set_defaults(run=_run_up)

    p = sub.add_parser("nats", help="an embedded nats-server with JetStream")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--nats-port", type=int, default=4222)
    p.add_argument("--data-dir", default=os.environ.get("LANEWAY_DATA_DIR", ".laneway"))
    p.add_argument("--config", help="a nats-server config, e.g. from `laneway nats-config`")
    p.set_defaults(run=_run_nats)

    p = sub.add_parser("broker", help="the scheduler")
    _nats_flags(p)
    _limits_flags(p)
    _metrics_flag(p)
    _gate_flags(p)
    p.set_defaults(run=_run_broker)

    p = sub.add_parser("worker", help="one engine in a pool")
    _nats_flags(p)
    _metrics_flag(p)
    p.add_argument("--pool", default="default")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--classes", nargs="*", help="classes this worker takes (default: all)")
    p.add_argument("--heartbeat-interval", type=float, default=2.0)
    p.add_argument("--in-progress-interval", type=float, default=5.0,
                   help="seconds between in-progress acks; keep well under the broker's --ack-wait")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds running requests may take to finish")
    p.add_argument("--frame-interval", type=float, default=0.002,
                   help="seconds between token frames at most (engine steps faster than this coalesce)")
    from workers import engines

    engines.configure_all(p)
    p.set_defaults(run=_run_worker)

    p = sub.add_parser("bridge", help="the OpenAI-compatible HTTP edge")
    _nats_flags(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--settings", default=os.environ.get("LANEWAY_SETTINGS"),
                   help="settings TOML (its default timeout; `laneway ops provision` puts its "
                        "tenants and models into KV) [LANEWAY_SETTINGS]")
    p.add_argument("--eval-scores", help="golden-set answers per pool (from `laneway eval "
                   "--save-scores`): the admin API's eval gate scores rule changes with them")
    _edge_flags(p)
    p.set_defaults(run=_run_bridge)

    # Tools: a module's configure(parser) and run(args), run_sync when it needs no event loop.
    from broker.usage import report as usage_report
    from laneway import nats_config, ops_config, ops_provision, ops_routing

    p = sub.add_parser("ops", help="operator one-shots: provision")
    ops_sub = p.add_subparsers(dest="ops_command", required=True)
    p = ops_sub.add_parser("provision", help="streams, buckets and the settings file into KV "
                                             "(create-if-absent), then exit: run it before the services")
    _nats_flags(p)
    _limits_flags(p)
    ops_provision.configure(p)
    p.set_defaults(run_sync=_run_provision)
    from loadtest import eval_run, generator, planner

    def tool(name: str, help: str, configure, run, *, sync: bool) -> None:
        p = sub.add_parser(name, help=help)
        configure(p)
        p.set_defaults(**{"run_sync" if sync else "run": run})

    tool("nats-config", "nats-server config with a user per tenant and service",
         nats_config.configure, nats_config.run, sync=True)
    tool("routing", "show, set, roll back the routing rules (live, versioned)",
         ops_routing.configure, ops_routing.run, sync=False)
    tool("eval", "golden-set quality and cost of candidate vs current rules",
         eval_run.configure, eval_run.run, sync=False)
    tool("classes", "list or change priority classes, live",
         ops_config.configure_classes, ops_config.run, sync=True)
    tool("tenants", "list or change tenants, live", ops_config.configure_tenants, ops_config.run, sync=True)
    def usage_flags(p: argparse.ArgumentParser) -> None:
        _nats_flags(p)
        usage_report.configure(p)

    tool("usage", "a tenant's metered usage from LW_USAGE (table or CSV)", usage_flags, usage_report.run,
         sync=True)
    tool("loadtest", "load generator: named scenarios, open or closed loop",
         generator.configure, generator.run, sync=True)
    tool("plan", "capacity and budget planner", planner.configure, planner.run, sync=True)

    p = sub.add_parser("model", help="model preparation")
    model_sub = p.add_subparsers(dest="model_command", required=True)
    from workers import model_prepare

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


TRACED = ("bridge", "broker", "worker")     # the processes a request's trace crosses


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, forwarded = parser.parse_known_args(argv)
    if forwarded and args.command != "up":
        parser.error(f"unrecognized arguments: {' '.join(forwarded)}")
    if args.command == "up":
        from laneway.up import ROLES, FlagError, route_flags

        try:
            forwarded = route_flags(forwarded, {role: args.subcommands[role] for role in ROLES})
        except FlagError as exc:
            parser.error(f"up: {exc}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if hasattr(args, "run_sync"):
        return args.run_sync(args)
    _install_uvloop()
    run: Callable[..., Awaitable[int]] = args.run
    # The standard OpenTelemetry variable; unset, tracing stays off and costs nothing.
    tracing = configure_tracing(f"laneway-{args.command}", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                                if args.command in TRACED else None)
    try:
        if args.command == "up":
            return asyncio.run(run(args, forwarded))
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    finally:
        tracing.shutdown()     # exports the spans still batched


if __name__ == "__main__":
    sys.exit(main())
