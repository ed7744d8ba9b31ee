"""Configuration of the `openai` engine: where the upstream is, its timeouts, its breaker, and
the request fields beyond the built-in list (`workers/engines/openai_wire.py`) that it forwards. The
upstream key is read from the environment variable named here, never from a request."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from core import env
from schemas.codec import LANEWAY_OWNED
from workers.engines.openai.circuit import BreakerConfig

DEFAULT_KEY_ENV = env.UPSTREAM_API_KEY.name


@dataclass(frozen=True, slots=True)
class OpenAIUpstreamConfig:
    base_url: str  # up to the API version, e.g. http://host:8000/v1
    model: str  # the upstream's model name, sent as `model`
    api_key_env: str = DEFAULT_KEY_ENV  # NAME of the env var holding the key (unset: no auth)
    max_concurrency: int = 64  # streams in flight at once: the slots reported
    token_budget: int = 1 << 30  # the upstream manages its own KV cache
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 30.0  # request sent → first token, per attempt
    idle_timeout_s: float = 30.0  # longest gap between chunks after the first token
    total_timeout_s: float = 600.0  # whole request, retries included
    retries: int = 2  # extra attempts, only before the first token
    backoff_s: float = 0.2  # first retry delay; doubles, jittered, capped
    backoff_max_s: float = 2.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    # Top-level fields a tenant may send this upstream beyond the built-in list: the fields that
    # act on the operator's account (store, service_tier, web_search_options, ...) only this way.
    allow_fields: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http:// or https:// URL")
        if not self.model:
            raise ValueError("model (the upstream's model name) is required")
        if self.max_concurrency < 1 or self.retries < 0:
            raise ValueError("max_concurrency must be >= 1 and retries >= 0")
        timeouts = (self.connect_timeout_s, self.first_token_timeout_s, self.idle_timeout_s, self.total_timeout_s)
        if min(timeouts) <= 0:
            raise ValueError("timeouts must be > 0")
        if owned := sorted(self.allow_fields & (LANEWAY_OWNED | {"model", "stream", "stream_options"})):
            raise ValueError(f"{owned} are set by Laneway, never forwarded from a request")

    @staticmethod
    def configure(parser: argparse.ArgumentParser) -> None:
        d = {name: f.default for name, f in OpenAIUpstreamConfig.__dataclass_fields__.items()}
        b = BreakerConfig()
        g = parser.add_argument_group("openai engine (--engine openai)")
        g.add_argument("--upstream-url", help="OpenAI-compatible base URL, e.g. http://host:8000/v1")
        g.add_argument("--upstream-model", help="model name the upstream serves")
        g.add_argument(
            "--upstream-key-env",
            default=DEFAULT_KEY_ENV,
            metavar="NAME",
            help="environment variable holding the upstream API key (default: %(default)s)",
        )
        g.add_argument(
            "--upstream-allow-field",
            action="append",
            default=[],
            metavar="NAME",
            help="a request field to forward beyond the built-in list; the only way a tenant's "
            "store, service_tier, web_search_options, ... reach the upstream (repeatable)",
        )
        flags: list[tuple[str, type, object, str]] = [
            ("max-concurrency", int, d["max_concurrency"], "streams in flight at once (the slots offered)"),
            ("connect-timeout", float, d["connect_timeout_s"], "seconds to open a TCP connection"),
            ("first-token-timeout", float, d["first_token_timeout_s"], "seconds from sending to the first token"),
            ("idle-timeout", float, d["idle_timeout_s"], "longest gap between tokens, seconds"),
            ("total-timeout", float, d["total_timeout_s"], "seconds for a whole request, retries included"),
            ("retries", int, d["retries"], "extra attempts, only before the first token"),
            ("backoff", float, d["backoff_s"], "first retry delay, seconds (doubles, jittered)"),
            ("breaker-failures", int, b.failure_threshold, "consecutive failures that open the breaker"),
            ("breaker-error-rate", float, b.error_rate, "failure share in the window that opens it"),
            ("breaker-window", float, b.window_s, "error-rate window, seconds"),
            ("breaker-min-volume", int, b.min_volume, "calls in the window before the rate counts"),
            ("breaker-cooldown", float, b.cooldown_s, "seconds open before a half-open probe"),
            ("breaker-probes", int, b.half_open_probes, "probes let through while half-open"),
        ]
        for name, kind, default, text in flags:
            g.add_argument(f"--upstream-{name}", type=kind, default=default, help=f"{text} (default: %(default)s)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OpenAIUpstreamConfig:
        if not args.upstream_url or not args.upstream_model:
            raise ValueError("--engine openai needs --upstream-url and --upstream-model")
        return cls(
            base_url=args.upstream_url.rstrip("/"),
            model=args.upstream_model,
            api_key_env=args.upstream_key_env,
            allow_fields=frozenset(args.upstream_allow_field),
            max_concurrency=args.upstream_max_concurrency,
            connect_timeout_s=args.upstream_connect_timeout,
            first_token_timeout_s=args.upstream_first_token_timeout,
            idle_timeout_s=args.upstream_idle_timeout,
            total_timeout_s=args.upstream_total_timeout,
            retries=args.upstream_retries,
            backoff_s=args.upstream_backoff,
            breaker=BreakerConfig(
                failure_threshold=args.upstream_breaker_failures,
                error_rate=args.upstream_breaker_error_rate,
                window_s=args.upstream_breaker_window,
                min_volume=args.upstream_breaker_min_volume,
                cooldown_s=args.upstream_breaker_cooldown,
                half_open_probes=args.upstream_breaker_probes,
            ),
        )
