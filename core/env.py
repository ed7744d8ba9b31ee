"""Every environment variable Laneway reads or sets, in one place: its name, default and meaning.

The command line (`laneway/`) reads these to give its flags their defaults and its processes
their secrets; everything below it gets its settings as arguments. The few variables set here
are other libraries' (vLLM, Presidio, Hugging Face), set where that library is imported, in the
process that imports it. `tests/unit/test_import_graph.py` keeps `os.environ` out of every
other module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

_D = TypeVar("_D", str, str | None, covariant=True)  # the default: a variable with one reads as a str


@dataclass(frozen=True, slots=True)
class Var(Generic[_D]):
    name: str
    default: _D
    meaning: str

    def get(self) -> str | _D:
        """The value as set (an empty string included), else the default."""
        return os.environ.get(self.name, self.default)

    def given(self) -> str | None:
        """The value as set, None when unset: whether the operator chose one."""
        return os.environ.get(self.name)


# -- NATS: every process ---------------------------------------------------------------------
NATS_URL = Var("LANEWAY_NATS_URL", "nats://127.0.0.1:4222", "server URL(s), comma-separated")
PREFIX = Var("LANEWAY_PREFIX", "lw", "subject, stream and bucket prefix of one deployment")
NATS_USER = Var("LANEWAY_NATS_USER", None, "the process's NATS user (from `laneway nats-config`)")
NATS_PASSWORD = Var("LANEWAY_NATS_PASSWORD", None, "its password: here, never in argv")
NATS_TLS_CA = Var(
    "LANEWAY_NATS_TLS_CA", None, "PEM file of the one CA to trust for tls:// URLs (empty: the system's CAs)"
)
NATS_JS_KEY = Var(
    "LANEWAY_NATS_JS_KEY",
    None,
    "the JetStream encryption key `laneway up` hands its nats-server (config: $LANEWAY_NATS_JS_KEY)",
)

# -- the processes ---------------------------------------------------------------------------
DATA_DIR = Var("LANEWAY_DATA_DIR", ".laneway", "`laneway up` and `laneway nats`: store, logs, generated secrets")
SETTINGS = Var("LANEWAY_SETTINGS", None, "settings TOML (tenants, models, prices)")
LOG_LEVEL = Var("LANEWAY_LOG_LEVEL", "INFO", "Python logging level of every process")
PII = Var("LANEWAY_PII", "auto", "the broker's PII stage: off | auto | regex | ner")
IDEMPOTENCY_SECRET = Var(
    "LANEWAY_IDEMPOTENCY_SECRET",
    None,
    "the bridge's HMAC key of Idempotency-Key → request id, the same on every replica",
)
ADMIN_KEY_SHA256 = Var(
    "LANEWAY_ADMIN_KEY_SHA256", "", "SHA-256 hex digests (comma-separated) of the keys the bridge's admin API takes"
)
UPSTREAM_API_KEY = Var(
    "LANEWAY_UPSTREAM_API_KEY", None, "the hosted API's key for `--engine openai` (another name: --upstream-key-env)"
)
OTEL_ENDPOINT = Var(
    "OTEL_EXPORTER_OTLP_ENDPOINT", None, "OpenTelemetry collector; unset, tracing is off and costs nothing"
)

# -- operator commands -----------------------------------------------------------------------
API_KEY = Var(
    "LANEWAY_API_KEY",
    None,
    "a tenant's key, for `laneway up`'s demo tenant, the eval/routing tools and `laneway batches|files`",
)
BASE_URL = Var(
    "LANEWAY_BASE_URL",
    "http://127.0.0.1:8080/v1",
    "the bridge's OpenAI API that `laneway batches|files` talk to (default: `laneway up`'s)",
)
ADMIN_NAME = Var("LANEWAY_ADMIN_NAME", None, "who `laneway routing set|rollback` records as the author")

REGISTRY: tuple[Var[str | None], ...] = tuple(v for v in globals().values() if isinstance(v, Var))


def named(name: str) -> str | None:
    """A variable whose name the operator chose (e.g. --upstream-key-env), unset: None."""
    return os.environ.get(name)


def child(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one's, with `extra` over it."""
    return {**os.environ, **(extra or {})}


def library_defaults(values: Mapping[str, str]) -> None:
    """Set another library's variables unless the user already has: call it before that library
    is imported, in the process that imports it."""
    for name, value in values.items():
        os.environ.setdefault(name, value)
