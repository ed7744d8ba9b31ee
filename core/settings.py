"""The settings file (tenants, logical models, prices) and its loader: what the bridge serves and
provisioning puts into KV.

Environment variables are read only by the command line (`laneway/`) through `core/env.py`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from core.metering import PriceBook
from core.policy.tenants import PUBLIC_KEYS, Tenant, with_public_keys
from schemas.requests import Token

# A model's context when its settings do not say: the docker-compose pools' --max-model-len.
DEFAULT_CONTEXT_TOKENS = 16_384
ContextTokens = Annotated[int, Meta(ge=1, le=10_000_000)]


class LogicalModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One row of the models table. Defaults stay out of KV, so a process that predates a field
    (it forbids unknown ones) still reads the table."""

    pool: Token
    description: str = ""
    max_context_tokens: ContextTokens = DEFAULT_CONTEXT_TOKENS  # a longer prompt is refused at the edge
    # A LoRA adapter on the pool's base model (a directory on the workers' disk): the workers
    # load it on first use under this logical model's name (vLLM: --enable-lora).
    adapter: Annotated[str, Meta(max_length=1024)] = ""
    # The tenants that may call it; empty: every tenant. For another tenant it does not exist
    # (404, not listed): a customer's fine-tuned adapter may have memorized that customer's data.
    tenants: list[Token] = []

    def serves(self, tenant: str) -> bool:
        return not self.tenants or tenant in self.tenants


def context_limit(models: Mapping[str, LogicalModel], name: str, default: int) -> int:
    """The longest prompt for model `name`: a models-table entry's own; a rule-routed model's pool
    is chosen later, so it gets `default` (--max-context-tokens, the same for bridge and broker)."""
    model = models.get(name)
    return model.max_context_tokens if model is not None else default


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The settings file: who may call (tenants) and what they may call (logical models)."""

    tenants: dict[str, Tenant] = {}
    models: dict[str, LogicalModel] = {}
    prices: PriceBook = PriceBook()  # $/1M tokens or GPU-hour prices per pool, for Usage.cost_usd
    # Requests live at most this long unless the client asks for less (x-laneway-timeout).
    default_timeout_s: Annotated[float, Meta(gt=0, le=86400)] = 600.0


class BadSettings(ValueError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def load_serving_settings(path: Path) -> Settings:
    """The settings a bridge serves (`laneway bridge`, `laneway up`): none of their keys may be
    one of the example keys Laneway's own files print."""
    settings = load_settings(path)
    if names := with_public_keys(settings.tenants.values()):
        raise BadSettings(
            path,
            f"tenant {', '.join(names)}: the key {PUBLIC_KEYS[0]!r} is a public example; "
            "put the SHA-256 of a real secret in api_key_sha256",
        )
    return settings


def load_settings(path: Path) -> Settings:
    try:
        raw = tomllib.loads(path.read_text())
        for name, doc in raw.get("tenants", {}).items():
            doc.setdefault("name", name)
        settings = msgspec.convert(raw, Settings)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise BadSettings(path, str(exc)) from None
    for name, tenant in settings.tenants.items():
        if tenant.name != name:
            raise BadSettings(path, f"tenant table {name!r} names tenant {tenant.name!r}")
        if tenant.default_class not in tenant.classes:
            raise BadSettings(path, f"tenant {name!r}: default_class not in classes")
    return settings
