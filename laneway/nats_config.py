"""NATS accounts and users: Laneway's services in one account, each tenant in an account of its own.

`laneway nats-config` writes them as a whole nats-server config; `laneway up` calls `up_auth`
for an `accounts { ... }` block (valid alone as `-c`, or through an `include`) that it keeps,
with its passwords, in its data directory.

Why accounts and not subject permissions on one shared account: NATS never checks the reply
subject of a publish, and JetStream sends its PubAck from its own client to whatever reply the
publisher named. A tenant on the services' account could name `$KV.lw_tenants.<other>` (or a
broker's heartbeat subject, the usage stream, ...) as the reply of a request and have JetStream
write there for it. In an account of its own, a tenant reaches the services only through what
the service account exports to it, and the server rewrites the reply of a service import, so
the PubAck can only come back to the publisher, inside the tenant's own account.

Each tenant account imports exactly its protocol (docs/subject-protocol.md):
`lw.req.<class>.<tenant>` for each class its tenant document lists, and `lw.cancel.<tenant>.*`,
as services, `lw.tok.<tenant>.>` as a stream. It has no JetStream of its own and sees nothing
else. Its one user also has subject permissions (the same subjects), so a publish outside them is
refused with a permissions error that the client can report, instead of vanishing; and account
limits (connections, subscriptions, payload), so one tenant cannot exhaust the server.

Why per class and not `lw.req.*.<tenant>`: LW_REQ caps each subject's backlog, not a tenant's
total, so a tenant free to name any class token could store as many messages as it could invent
tokens, and every one costs the broker a read and a dead letter. Named classes bound it to
(classes listed) x `--backlog-per-tenant`; a made-up or a withheld class is refused by the server.

The classes are the tenant documents' as the config is written (the settings file's, or a new
tenant's defaults for a bare `--tenant` name). The config does not follow live changes: a class
given to a tenant with `laneway tenants set` (or a class added with `laneway classes set` that the
document did not already list) reaches its NATS user only when the config is written again and
nats-server reloads it (`laneway up`: a restart; docker compose: rerun `nats-auth`, then SIGHUP
the nodes; the Helm chart: an upgrade with the new settings). Until then the bridge serves the
class (it publishes as the bridge's user) and the broker still refuses a class taken away (the
gate reads the live document).

What each user may publish and subscribe to is laneway/nats_permissions.py's.

Passwords are generated and stored in plain text in the config (keep it 0600; it is written so)
and in a credentials file to hand out; nats-server also accepts bcrypt hashes in their place.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from core.policy.tenants import Tenant
from laneway.nats_permissions import (
    ROLES,
    service_permissions,
    tenant_permissions,
    tenant_subjects,
    tenant_user,
    user_name,
)
from schemas.subjects import Subjects, check_token

SERVICE_ACCOUNT = "LANEWAY"


def tenant_account(tenant: str) -> str:
    return f"TENANT_{check_token('tenant', tenant)}"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """Per tenant account, and so per tenant user: a tenant holds a few connections (one per
    service replica) with a few subscriptions each (one inbox per client, PubAck inboxes)."""

    max_connections: int = 64
    max_subscriptions: int = 1024
    max_payload: int = 1024 * 1024  # nats-server's default; the server's own limit still applies

    def block(self) -> dict:
        return {
            "max_connections": self.max_connections,
            "max_subscriptions": self.max_subscriptions,
            "max_payload": self.max_payload,
        }


def tenant_classes(tenants: Iterable[str | Tenant]) -> dict[str, tuple[str, ...]]:
    """tenant → the classes its NATS user may publish requests in: a document's `classes`; a
    bare name gets a new tenant's default classes. A name listed twice is a config error: the
    first one counts."""
    found: dict[str, tuple[str, ...]] = {}
    for t in tenants:
        doc = t if isinstance(t, Tenant) else Tenant(name=check_token("tenant", t))
        found.setdefault(doc.name, tuple(dict.fromkeys(check_token("class", c) for c in doc.classes)))
    return found


def tenant_exports(s: Subjects, tenant: str, classes: Iterable[str]) -> list[dict]:
    """What the service account offers this tenant's account, and no other."""
    requests, cancels, tokens = tenant_subjects(s, tenant, classes)
    to = [tenant_account(tenant)]
    return [
        *({"service": r, "accounts": to, "response_type": "singleton"} for r in requests),  # one PubAck
        {"service": cancels, "accounts": to},
        {"stream": tokens, "accounts": to},
    ]


def tenant_imports(s: Subjects, tenant: str, classes: Iterable[str]) -> list[dict]:
    requests, cancels, tokens = tenant_subjects(s, tenant, classes)
    return [
        *({"service": {"account": SERVICE_ACCOUNT, "subject": r}} for r in requests),
        {"service": {"account": SERVICE_ACCOUNT, "subject": cancels}},
        {"stream": {"account": SERVICE_ACCOUNT, "subject": tokens}},
    ]


def _user(name: str, passwords: dict[str, str], permissions: dict) -> dict:
    return {"user": name, "password": passwords[name], "permissions": permissions}


def accounts(
    s: Subjects, tenants: Iterable[str | Tenant], passwords: dict[str, str], limits: TenantLimits = TenantLimits()
) -> dict:
    """The `accounts` map: the service account with JetStream and every role's user, and one
    account per tenant with its user, its imports and its limits. A tenant is its document (its
    classes are what its user may publish in) or a bare name (a new tenant's default classes)."""
    classes = tenant_classes(tenants)
    services = {
        "jetstream": "enabled",
        "users": [_user(user_name(role), passwords, perms) for role, perms in service_permissions(s).items()],
        "exports": [export for t, c in classes.items() for export in tenant_exports(s, t, c)],
    }
    result: dict[str, dict] = {SERVICE_ACCOUNT: services}
    for t, c in classes.items():
        result[tenant_account(t)] = {
            "users": [_user(tenant_user(t), passwords, tenant_permissions(s, t, c))],
            "imports": tenant_imports(s, t, c),
            "limits": limits.block(),
        }
    return result


def user_names(tenants: Iterable[str]) -> list[str]:
    return [user_name(role) for role in ROLES] + [tenant_user(t) for t in tenants]


def generate_passwords(tenants: Iterable[str]) -> dict[str, str]:
    """Hex, 192 bits: a URL-safe token starts with `-` one time in 64, and an operator who passes
    such a password as `--nats-password <it>` gets argparse's "expected one argument"."""
    return {name: secrets.token_hex(24) for name in user_names(tenants)}


def accounts_block(
    s: Subjects, tenants: Iterable[str | Tenant], passwords: dict[str, str], limits: TenantLimits = TenantLimits()
) -> str:
    """`accounts {...}` alone: a whole config, or a file to `include` in one. JSON is valid
    nats-server config syntax as a map value, so quoting is exact."""
    return "accounts " + json.dumps(accounts(s, tenants, passwords, limits), indent=2) + "\n"


def render(
    s: Subjects,
    tenants: Iterable[str | Tenant],
    passwords: dict[str, str],
    *,
    store_dir: str | None = None,
    host: str = "0.0.0.0",
    port: int = 4222,
    limits: TenantLimits = TenantLimits(),
) -> str:
    """A whole config, for `laneway nats-config`."""
    config: dict = {
        "host": host,
        "port": port,
        "jetstream": {"store_dir": store_dir} if store_dir else {},
        "accounts": accounts(s, tenants, passwords, limits),
    }
    return json.dumps(config, indent=2)


def write_private(path: Path, text: str) -> None:
    """Write a secret file that is never readable by others, not even for a moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        f.write(text)
    os.replace(tmp, path)


# -- laneway up -------------------------------------------------------------------------------
AUTH_FILE = "nats-auth.conf"
CREDENTIALS_FILE = "nats-credentials.json"


@dataclass(frozen=True, slots=True)
class UpAuth:
    authorization_file: Path  # `accounts {...}`: -c it, or include it
    credentials_file: Path  # user → password JSON, as `nats-config` writes it
    services: dict[str, tuple[str, str]]  # broker|worker|bridge|ops → (user, password)
    tenants: dict[str, tuple[str, str]]  # tenant → (user, password)


def up_auth(s: Subjects, tenants: Iterable[str | Tenant], data_dir: Path) -> UpAuth:
    """Users for `laneway up`'s nats-server, in `data_dir`. Passwords already in its credentials
    file are kept, so a restart on the same data dir works with the same credentials; a new
    tenant gets a new one and a tenant no longer listed loses its user. Tenants as `accounts`
    takes them: documents (their classes), or names (the default classes)."""
    tenants = list(tenants)
    names = list(tenant_classes(tenants))  # a user listed twice is a config error: once here
    data_dir.mkdir(parents=True, exist_ok=True)
    auth_path, creds_path = data_dir / AUTH_FILE, data_dir / CREDENTIALS_FILE
    known: dict[str, str] = {}
    if creds_path.exists():
        try:
            known = json.loads(creds_path.read_text())
            if not isinstance(known, dict) or not all(isinstance(v, str) for v in known.values()):
                raise ValueError("not a JSON object of user → password")
        except ValueError as exc:
            raise ValueError(f"{creds_path}: {exc}; delete it to generate new passwords") from None
    fresh = generate_passwords(names)
    passwords = {name: known.get(name) or fresh[name] for name in fresh}
    write_private(auth_path, accounts_block(s, tenants, passwords))
    write_private(creds_path, json.dumps(passwords, indent=2))
    return UpAuth(
        auth_path,
        creds_path,
        {role: (user_name(role), passwords[user_name(role)]) for role in ROLES},
        {t: (tenant_user(t), passwords[tenant_user(t)]) for t in names},
    )


# -- laneway nats-config ----------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant",
        action="append",
        default=[],
        help="a tenant name (repeat); its user may publish in the default classes",
    )
    parser.add_argument("--settings", help="take tenants, and the classes each may use, from this settings TOML")
    parser.add_argument("--prefix", default="lw")
    parser.add_argument("--port", type=int, default=4222)
    parser.add_argument("--store-dir", default=None)
    parser.add_argument("--out", type=Path, required=True, help="nats-server config to write")
    parser.add_argument(
        "--credentials-out", type=Path, required=True, help="user → password JSON to hand out (keep secret)"
    )


def run(args: argparse.Namespace) -> int:
    tenants: list[str | Tenant] = []
    if args.settings:
        from core.settings import load_settings

        tenants += load_settings(Path(args.settings)).tenants.values()
    tenants = [*tenants, *args.tenant]  # a name the settings list keeps the settings' classes
    passwords = generate_passwords(tenant_classes(tenants))
    write_private(args.out, render(Subjects(args.prefix), tenants, passwords, store_dir=args.store_dir, port=args.port))
    write_private(args.credentials_out, json.dumps(passwords, indent=2))
    print(
        f"wrote {args.out} ({len(passwords) - len(ROLES)} tenants, {len(ROLES)} roles: {', '.join(ROLES)}) "
        f"and {args.credentials_out}"
    )
    return 0
