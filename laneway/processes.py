"""What each `laneway` command runs: a process built from its parsed flags, until signalled."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from core import env, heap
from core.settings import BadSettings, load_serving_settings
from laneway.flags import nats_from_args, stream_limits


def serve_metrics(args: argparse.Namespace, registry) -> None:
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host, registry=registry)


async def until_signalled(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_broker(args: argparse.Namespace) -> int:
    from broker.app import Broker
    from broker.config import BrokerConfig

    broker = Broker(
        BrokerConfig(
            nats=nats_from_args(args),
            limits=stream_limits(args),
            quotas=not args.no_quotas,
            cache_ttl_s=args.cache_ttl,
            pii=args.pii,
            pii_workers=args.pii_workers,
            pii_max_chars=args.pii_max_chars,
            max_context_tokens=args.max_context_tokens,
            prefix_affinity=not args.no_prefix_affinity,
        )
    )
    serve_metrics(args, broker.metrics.registry)
    async with broker:
        heap.settle()
        await until_signalled(asyncio.Event())
    return 0


async def run_worker(args: argparse.Namespace) -> int:
    from laneway import engines
    from workers.runner import Worker, WorkerConfig

    engine = engines.build(args)
    config = WorkerConfig(
        nats=nats_from_args(args),
        pool=args.pool,
        worker_id=args.worker_id or "",
        classes=tuple(args.classes or ()),
        heartbeat_s=args.heartbeat_interval,
        in_progress_s=args.in_progress_interval,
        drain_s=args.drain_timeout,
        frame_interval_s=args.frame_interval,
    )
    worker = Worker(config, engine)
    serve_metrics(args, worker.metrics.registry)
    stop = asyncio.Event()
    signals = asyncio.create_task(until_signalled(stop))
    await worker.start()
    heap.settle()
    done = asyncio.create_task(worker.wait())
    await asyncio.wait([signals, done], return_when=asyncio.FIRST_COMPLETED)
    await worker.stop()
    signals.cancel()
    return 1 if worker.dead is not None else 0


async def run_bridge(args: argparse.Namespace) -> int:
    from bridge.admin import AdminConfig
    from bridge.app import Bridge
    from bridge.config import MIN_SECRET_CHARS, BridgeConfig

    try:
        settings = load_serving_settings(Path(args.settings)) if args.settings else None
    except BadSettings as exc:
        print(f"laneway bridge: {exc}", file=sys.stderr)
        return 2
    secret = env.IDEMPOTENCY_SECRET.get() or ""
    if len(secret) < MIN_SECRET_CHARS:
        # Never a default: every replica must derive the same request id from an Idempotency-Key.
        print(
            f"laneway bridge: ${env.IDEMPOTENCY_SECRET.name} is {'too short' if secret else 'not set'}: give "
            f"every bridge replica the same secret of at least {MIN_SECRET_CHARS} characters (e.g. "
            "`openssl rand -hex 32`); `laneway up` makes its own",
            file=sys.stderr,
        )
        return 2
    evaluator = None
    if args.eval_scores:
        from core.routing.eval_gate import load_golden, load_results, results_evaluator

        evaluator = results_evaluator(load_golden(), load_results(Path(args.eval_scores)))
    bridge = Bridge(
        BridgeConfig(
            nats=nats_from_args(args),
            host=args.host,
            port=args.port,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            max_connections=args.max_connections,
            max_streams=args.max_streams,
            initial_stream_limit=args.initial_stream_limit,
            max_delivery_lag_s=args.max_delivery_lag,
            lower_class_lag_s=args.lower_class_lag,
            tenant_max_streams=args.tenant_max_streams,
            tenant_stream_share=args.tenant_stream_share,
            stream_buffer_bytes=args.stream_buffer_bytes,
            tenant_buffer_bytes=args.tenant_buffer_bytes,
            write_timeout_s=args.write_timeout,
            resume_window_s=args.resume_window_s,
            resume_tenant_bytes=args.resume_tenant_bytes,
            max_migrations=args.max_migrations,
            max_context_tokens=args.max_context_tokens,
            max_file_bytes=args.max_file_bytes,
            batch_concurrency=args.batch_concurrency,
            batch_lease_s=args.batch_lease_s,
            publish_timeout_s=args.publish_timeout,
            publish_tries=args.publish_tries,
            background_lease_s=args.background_lease,
            store_replicas=args.store_replicas,
            idempotency_secret=secret,
        ),
        settings,
        admin=AdminConfig.parse(env.ADMIN_KEY_SHA256.get() or ""),
        evaluator=evaluator,
    )
    async with bridge:
        print(f"laneway bridge on {bridge.url}", flush=True)
        heap.settle()
        await until_signalled(asyncio.Event())
    return 0


async def run_nats(args: argparse.Namespace) -> int:
    from core.natsd import NatsServer
    from core.owner import DirInUse

    server = NatsServer(
        Path(args.data_dir) / "nats",
        host=args.host,
        port=args.nats_port,
        config_file=Path(args.config) if args.config else None,
    )
    try:
        await server.start()
    except DirInUse as exc:
        print(f"laneway nats: {exc}: stop it first, or choose another --data-dir", file=sys.stderr)
        return 2
    try:
        print(f"nats-server with JetStream on {server.url} (store {server.store_dir})", flush=True)
        await until_signalled(asyncio.Event())
    finally:
        await server.stop()
    return 0


def run_provision(args: argparse.Namespace) -> int:
    from laneway import ops_provision

    return ops_provision.run(args, stream_limits(args))


async def run_up(args: argparse.Namespace, forwarded: dict[str, list[str]]) -> int:
    from laneway.up import up

    return await up(args, forwarded)
