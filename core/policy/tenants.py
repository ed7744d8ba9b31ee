"""Tenants: who may call, with which classes and what fair-share weight. API keys stored hashed.

Tenant documents live in the `lw_tenants` KV bucket (JSON, one key per tenant); a settings file
seeds them. Only the SHA-256 of a key is ever stored or compared: a leaked bucket or log line
gives no usable key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator
from typing import Annotated

import msgspec
from msgspec import Meta

from core.policy.pii import TenantPiiPolicy
from core.policy.quota import QuotaPolicy
from core.policy.storage_quota import StorageQuota
from core.policy.stored import StoragePolicy
from schemas.requests import Token

KeyHash = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


# Keys printed in Laneway's own examples (deploy/settings.toml, the chart's values): anyone can
# read them, so none of them ever opens a tenant, and a bridge configured with one will not start.
PUBLIC_KEYS = ("lw-demo-key-CHANGE-ME",)
_PUBLIC_HASHES = frozenset(hash_key(key) for key in PUBLIC_KEYS)


def with_public_keys(tenants: Iterable[Tenant]) -> list[str]:
    """The tenants whose keys include a public example key."""
    return sorted(t.name for t in tenants if _PUBLIC_HASHES.intersection(t.api_key_sha256))


class Tenant(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Token
    api_key_sha256: list[KeyHash] = []
    default_class: Token = "interactive"
    classes: list[Token] = msgspec.field(default_factory=lambda: ["interactive", "standard", "batch"])
    weight: Annotated[float, Meta(gt=0, le=1000)] = 1.0
    quota: QuotaPolicy = QuotaPolicy()  # unlimited unless set
    pii: TenantPiiPolicy = TenantPiiPolicy()  # sensible B2B defaults; custom recognizers live here
    cache_group: Token | None = None  # tenants in one group share cached answers
    responses: StoragePolicy = StoragePolicy()  # stored responses: kept or not, for how long
    storage: StorageQuota = StorageQuota()  # what Laneway keeps for it at rest: files, stored records

    def may_use(self, klass: str) -> bool:
        return klass in self.classes


class BadTenant(ValueError):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"tenant {name!r}: {reason}")
        self.name = name
        self.reason = reason


_decode = msgspec.json.Decoder(Tenant).decode
encode = msgspec.json.Encoder().encode


def decode(name: str, document: bytes) -> Tenant:
    try:
        tenant = _decode(document)
    except msgspec.DecodeError as exc:
        raise BadTenant(name, str(exc)) from None
    if tenant.name != name:
        raise BadTenant(name, f"document names tenant {tenant.name!r}")
    if tenant.default_class not in tenant.classes:
        raise BadTenant(name, f"default_class {tenant.default_class!r} is not in classes")
    return tenant


class TenantDirectory:
    """API key → tenant, by hash, rebuilt whenever a tenant document changes."""

    def __init__(self, tenants: list[Tenant] | None = None) -> None:
        self._tenants: dict[str, Tenant] = {}
        self._by_hash: dict[str, Tenant] = {}
        for tenant in tenants or []:
            self.put(tenant)

    def put(self, tenant: Tenant) -> None:
        self._tenants[tenant.name] = tenant
        self._reindex()

    def remove(self, name: str) -> None:
        self._tenants.pop(name, None)
        self._reindex()

    def _reindex(self) -> None:
        self._by_hash = {h: t for t in self._tenants.values() for h in t.api_key_sha256}

    def get(self, name: str) -> Tenant | None:
        return self._tenants.get(name)

    def weight(self, name: str) -> float:
        tenant = self._tenants.get(name)
        return tenant.weight if tenant else 1.0

    def authenticate(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)
        if digest in _PUBLIC_HASHES:
            return None
        tenant = self._by_hash.get(digest)
        # The dict lookup already matched; compare_digest keeps the final check constant-time.
        if tenant is not None and any(hmac.compare_digest(digest, h) for h in tenant.api_key_sha256):
            return tenant
        return None

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self._tenants.values())

    def __len__(self) -> int:
        return len(self._tenants)
