"""The flags several `laneway` commands share, their defaults from `core/env.py`, and the
configs they build. Each group of flags and the function that reads it back sit together."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.config import BridgeConfig
from broker.config import DEFAULT_PII_MAX_CHARS
from broker.gate.pii.service import MODES
from core import env
from core.connect import NatsSettings
from core.settings import DEFAULT_CONTEXT_TOKENS
from core.topology import StreamLimits
from laneway import stack_dir


def nats_from_env() -> NatsSettings:
    return NatsSettings(
        url=env.NATS_URL.get(),
        prefix=env.PREFIX.get(),
        user=env.NATS_USER.get(),
        password=env.NATS_PASSWORD.get(),
        tls_ca=env.NATS_TLS_CA.get() or None,
    )


def add_nats_flags(parser: argparse.ArgumentParser) -> None:
    """--nats-url, --prefix, --nats-user, --nats-password, --nats-tls-ca; defaults from the environment."""
    d = nats_from_env()
    g = parser.add_argument_group("NATS")
    g.add_argument("--nats-url", default=d.url, help=f"server URL(s), comma-separated [{env.NATS_URL.name}]")
    g.add_argument("--prefix", default=d.prefix, help=f"subject prefix [{env.PREFIX.name}]")
    g.add_argument("--nats-user", default=d.user, help=f"[{env.NATS_USER.name}]")
    g.add_argument("--nats-password", default=d.password, help=f"[{env.NATS_PASSWORD.name}]")
    g.add_argument(
        "--nats-tls-ca",
        default=d.tls_ca,
        metavar="PEM",
        help=f"trust only this CA for TLS (tls:// URLs), not the system's [{env.NATS_TLS_CA.name}]",
    )


def ops_nats_flags(parser: argparse.ArgumentParser) -> None:
    """An operator command's NATS flags: where neither a flag nor the environment names NATS, the
    NATS of the `laneway up` running on --data-dir, as its ops user (`find_stack` below)."""
    add_nats_flags(parser)
    parser.add_argument(
        "--data-dir",
        default=env.DATA_DIR.get(),
        help="without --nats-url: reach the `laneway up` running on this data dir, as its "
        f"ops user [{env.DATA_DIR.name}]",
    )
    parser.set_defaults(nats_url=env.NATS_URL.given(), find_stack=True)


class NoNats(RuntimeError):
    def __init__(self, data_dir: Path) -> None:
        super().__init__(
            f"no NATS to reach: no --nats-url or ${env.NATS_URL.name}, and no `laneway up` runs "
            f"on the data dir {data_dir}. Start `laneway up` (or pass --data-dir of the one "
            f"running), or pass --nats-url URL / set {env.NATS_URL.name}"
        )
        self.data_dir = data_dir


def find_stack(args: argparse.Namespace) -> None:
    """Fill in an operator command's NATS URL from the stack running on its --data-dir when none
    was given, and the ops user's login when none was given for that stack's URL. Raises NoNats
    when there is neither a URL nor a stack: the default port would only fail further on."""
    data_dir = Path(args.data_dir).resolve()
    running = stack_dir.running(data_dir)
    if args.nats_url is None:
        if running is None:
            raise NoNats(data_dir)
        args.nats_url = running.nats_url
    if (
        args.nats_user is None
        and running is not None
        and running.nats_url == args.nats_url
        and (login := stack_dir.ops_login(running)) is not None
    ):
        args.nats_user, args.nats_password = login


def unreachable(args: argparse.Namespace, exc: Exception) -> str:
    return (
        f"cannot reach NATS at {args.nats_url} ({exc}). Is it running there? Without --nats-url and "
        f"{env.NATS_URL.name}, an operator command reaches the `laneway up` running on its --data-dir "
        f"({Path(args.data_dir).resolve()})"
    )


def nats_from_args(args: argparse.Namespace) -> NatsSettings:
    return NatsSettings(
        url=args.nats_url, prefix=args.prefix, user=args.nats_user, password=args.nats_password, tls_ca=args.nats_tls_ca
    )


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def limits_flags(parser: argparse.ArgumentParser) -> None:
    d = StreamLimits()
    g = parser.add_argument_group("request stream (LW_REQ)")
    g.add_argument(
        "--backlog-per-tenant",
        type=int,
        default=d.max_msgs_per_subject,
        help="queued + running requests per (class, tenant); beyond it: 429",
    )
    g.add_argument(
        "--ack-wait", type=float, default=d.ack_wait_s, help="seconds before an unacknowledged request is redelivered"
    )
    g.add_argument("--max-deliver", type=int, default=d.max_deliver)
    g.add_argument(
        "--max-stream-gib",
        type=positive_float,
        default=d.max_bytes / 1024**3,
        help="GiB the queued requests may take; JetStream reserves it on disk when the "
        "stream is created, and a full stream refuses new requests (503)",
    )
    g.add_argument("--replicas", type=int, default=d.replicas, help="stream replicas (3 on a cluster)")
    g.add_argument(
        "--dlq-max-age-days",
        type=float,
        default=d.dlq_max_age_s / 86400,
        help="days LW_DLQ keeps a dead-lettered request",
    )
    g.add_argument(
        "--dlq-max-mib",
        type=positive_float,
        default=d.dlq_max_bytes / 1024**2,
        help="MiB LW_DLQ may take (reserved on disk); beyond it the oldest records go",
    )


def stream_limits(args: argparse.Namespace) -> StreamLimits:
    """The limits flags as `StreamLimits` (the broker's, and provisioning's: `ops provision`, `up`)."""
    return StreamLimits(
        max_msgs_per_subject=args.backlog_per_tenant,
        ack_wait_s=args.ack_wait,
        max_deliver=args.max_deliver,
        replicas=args.replicas,
        max_bytes=int(args.max_stream_gib * 1024**3),
        dlq_max_age_s=args.dlq_max_age_days * 86400,
        dlq_max_bytes=int(args.dlq_max_mib * 1024**2),
    )


def edge_flags(parser: argparse.ArgumentParser) -> None:
    d = BridgeConfig()
    g = parser.add_argument_group("client limits")
    g.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        help="seconds a connection may go without a whole request head (idle keep-alive too)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        help="seconds a request body may take to arrive, however it trickles; then 408 "
        "(an upload: one more for each 64 KiB it delivered)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help="open connections at most; past it a connection gets 503 and is closed",
    )
    g.add_argument(
        "--max-streams",
        type=int,
        default=d.max_streams,
        help="open streams at most (0: no cap); past it a request gets 503 before it is stored",
    )
    g.add_argument(
        "--initial-stream-limit",
        type=int,
        default=d.initial_stream_limit,
        help="open streams the bridge takes at first; it then finds how many it delivers on "
        "time from its own lag, above or below (0: off, --max-streams alone)",
    )
    g.add_argument(
        "--max-delivery-lag",
        type=float,
        default=d.max_delivery_lag_s,
        help="seconds late (smoothed) the bridge's token frames may run before it takes no "
        "new stream (503) until it catches up; 0: off",
    )
    g.add_argument(
        "--lower-class-lag",
        type=float,
        default=d.lower_class_lag_s,
        help="seconds late (smoothed) the bridge's frames may run while a higher class streams "
        "before it takes fewer streams of the classes under it; 0: off (one measured limit for all)",
    )
    g.add_argument(
        "--tenant-max-streams",
        type=int,
        default=d.tenant_max_streams,
        help="one tenant's open streams on this bridge at most (0: no cap); past it, 429 before the request is stored",
    )
    g.add_argument(
        "--tenant-stream-share",
        type=float,
        default=d.tenant_stream_share,
        help="of a class's share of the stream limit, what one tenant may hold while other "
        "tenants want streams there (1.0: off); past it, 503 before the request is stored",
    )
    g.add_argument(
        "--stream-buffer-bytes",
        type=int,
        default=d.stream_buffer_bytes,
        help="bytes of one stream that may wait for a client that is not reading; past "
        "it the stream ends with slow_reader and its generation is cancelled",
    )
    g.add_argument(
        "--tenant-buffer-bytes",
        type=int,
        default=d.tenant_buffer_bytes,
        help="the same over all of one tenant's streams on this bridge",
    )
    g.add_argument(
        "--write-timeout",
        type=float,
        default=d.write_timeout_s,
        help="seconds one SSE write may wait on a client that does not read; then the "
        "connection is dropped and the generation cancelled (0: no limit)",
    )
    g.add_argument(
        "--resume-window-s",
        type=float,
        default=d.resume_window_s,
        help="seconds a streamed answer whose client left stays resumable with Last-Event-ID, "
        "its generation going on meanwhile; then it is cancelled (0: no resuming, "
        "cancelled at once)",
    )
    g.add_argument(
        "--max-migrations",
        type=int,
        default=d.max_migrations,
        help="times a stream whose worker died goes on on another worker; the next loss "
        "ends it with worker_lost and its request is dead-lettered",
    )
    g.add_argument(
        "--resume-tenant-bytes",
        type=int,
        default=d.resume_tenant_bytes,
        help="bytes of events one tenant's streams keep for resuming on this bridge; past it "
        "its abandoned streams are expired first",
    )
    context_flag(g)
    g.add_argument(
        "--max-file-bytes",
        type=int,
        default=d.max_file_bytes,
        help="the largest file /v1/files takes (OpenAI's batch input limit by default)",
    )
    g.add_argument(
        "--batch-concurrency",
        type=int,
        default=d.batch_concurrency,
        help="lines of batches this bridge has in flight at once",
    )
    g.add_argument(
        "--batch-lease-s",
        type=float,
        default=d.batch_lease_s,
        help="seconds a bridge's claim on a batch lasts unrenewed; another bridge takes "
        "the batch over after it (a bridge that died)",
    )
    g.add_argument(
        "--publish-timeout",
        type=float,
        default=d.publish_timeout_s,
        help="seconds to wait for JetStream to confirm a request before publishing it again "
        "(same Nats-Msg-Id: stored once)",
    )
    g.add_argument(
        "--publish-tries", type=int, default=d.publish_tries, help="publishes of one request before the client gets 503"
    )
    g = parser.add_argument_group("stored responses")
    g.add_argument(
        "--background-lease",
        type=float,
        default=d.background_lease_s,
        help="seconds between a running background response's heartbeats in the store; "
        "unrefreshed for 4 of them, it reads as failed (its bridge is gone)",
    )
    g.add_argument(
        "--store-replicas",
        type=int,
        default=d.store_replicas,
        help="replicas of the lw_responses bucket when this bridge creates it (3 on a cluster)",
    )


def context_flag(group) -> None:
    """The bridge's and the broker's (it checks again what a direct publisher sends): `up` gives both the same."""
    group.add_argument(
        "--max-context-tokens",
        type=int,
        default=DEFAULT_CONTEXT_TOKENS,
        help="the longest prompt for rule-routed models (models-table entries set their own)",
    )


def gate_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("admission gate")
    g.add_argument(
        "--pii",
        choices=MODES,
        default=env.PII.get(),
        help="PII stage: auto = Presidio if installed (NER if its model is) [LANEWAY_PII]",
    )
    g.add_argument("--pii-workers", type=int, default=None, help="PII process pool size")
    g.add_argument(
        "--pii-max-chars",
        type=at_least_one,
        default=DEFAULT_PII_MAX_CHARS,
        help="the most text (characters) of one request the PII stage analyses; a request "
        "with more is refused before analysis (413 pii_too_large)",
    )
    g.add_argument("--no-quotas", action="store_true", help="do not enforce tenant quotas")
    g.add_argument("--cache-ttl", type=float, default=3600.0, help="response cache TTL; 0: off")
    context_flag(g)
    s = parser.add_argument_group("scheduler")
    s.add_argument(
        "--no-prefix-affinity",
        action="store_true",
        help="give a pull the most urgent request regardless of which worker holds its prompt "
        "prefix (the baseline the affinity benchmark compares with)",
    )


def at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def metrics_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    # Loopback unless asked: the metrics carry tenant names and their traffic, and nothing but
    # a scraper in the same pod or network namespace should read them (the chart and compose
    # pass 0.0.0.0 behind their network policy / unpublished ports).
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address the metrics listener binds (default loopback only)"
    )


# `laneway up` keeps its demo tenant's key here, in its data dir: the Files and Batches commands
# fall back to it, so they work on the machine that runs `up` with nothing exported.
DEMO_KEY_FILE = "demo-api-key"


def api_flags(parser: argparse.ArgumentParser) -> None:
    """--base-url, --api-key, --data-dir: a bridge's OpenAI API and a tenant's key for it."""
    g = parser.add_argument_group("the bridge")
    g.add_argument(
        "--base-url",
        default=env.BASE_URL.given(),
        help=f"its OpenAI API [{env.BASE_URL.name}; else the bridge of the `laneway up` running on "
        f"--data-dir; else {env.BASE_URL.default}]",
    )
    g.add_argument(
        "--api-key",
        default=env.API_KEY.get(),
        help=f"a tenant's key [{env.API_KEY.name}; else the demo key of `laneway up` in --data-dir]",
    )
    g.add_argument("--data-dir", default=env.DATA_DIR.get(), help=f"`laneway up`'s data dir [{env.DATA_DIR.name}]")


def base_url_from_args(args: argparse.Namespace) -> str:
    if args.base_url:
        return args.base_url
    running = stack_dir.running(Path(args.data_dir).resolve())
    return f"{running.url}/v1" if running is not None and running.url else env.BASE_URL.default


def api_key_from_args(args: argparse.Namespace) -> str | None:
    if args.api_key:
        return args.api_key
    path = Path(args.data_dir) / DEMO_KEY_FILE
    if not path.is_file():
        return None
    return path.read_text().strip() or None
