"""`laneway nats-config`: a nats-server config with one user per tenant and per service role.

Tenants may only publish requests as themselves (`lw.req.*.<tenant>`) and cancels for their
own requests, and only receive their own token frames (`lw.tok.<tenant>.>`) and JetStream
PubAcks on their own inbox prefix (`_INBOX_<tenant>.>`; connect with nats-py's
`inbox_prefix="_INBOX_<tenant>"`). Services get exactly the subjects their role uses.

Passwords are generated, written to the config (keep it 0600) and to a separate credentials
file to hand out; nats-server also accepts bcrypt hashes in their place.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path

from schemas.subjects import Subjects, check_token

JS_API = "$JS.API.>"
JS_ACK = "$JS.ACK.>"


def _kv(s: Subjects) -> list[str]:
    # Wildcards are whole tokens only, so each bucket is named.
    return [f"$KV.{s.bucket(name)}.>" for name in ("classes", "tenants", "routing", "cache", "quotas")]


def service_permissions(s: Subjects) -> dict[str, dict[str, list[str]]]:
    p = s.prefix
    kv = _kv(s)
    return {
        "broker": {
            "publish": [f"{p}.tok.>", f"{p}.dlq.>", f"{p}.evt.>", f"{p}.audit.>", JS_API, JS_ACK, "_INBOX.>", *kv],
            "subscribe": [f"{p}.pull.*", f"{p}.cancel.>", f"{p}.evt.>", "_INBOX.>",  # evt.ping too
                          "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>", *kv],
        },
        "worker": {
            # req: the cascade re-sends a low-confidence request for the large pool.
            "publish": [f"{p}.req.>", f"{p}.tok.>", f"{p}.pull.*", f"{p}.usage.>", f"{p}.dlq.>", f"{p}.evt.>",
                        f"{p}.audit.>", JS_API, JS_ACK, "_INBOX.>"],
            "subscribe": [f"{p}.cancel.>", f"{p}.evt.ping", "_INBOX.>"],
        },
        "bridge": {
            "publish": [f"{p}.req.>", f"{p}.cancel.>", f"{p}.evt.ping", JS_API, "_INBOX.>", *kv],
            "subscribe": [f"{p}.tok.>", f"{p}.evt.>", "_INBOX.>", *kv],
        },
    }


def tenant_permissions(s: Subjects, tenant: str) -> dict[str, list[str]]:
    check_token("tenant", tenant)
    p = s.prefix
    return {
        "publish": [f"{p}.req.*.{tenant}", f"{p}.cancel.{tenant}.*"],
        "subscribe": [f"{p}.tok.{tenant}.>", f"_INBOX_{tenant}.>"],
    }


def _users(s: Subjects, tenants: list[str], passwords: dict[str, str]) -> list[dict]:
    users = []
    for role, perms in service_permissions(s).items():
        users.append({"user": f"svc-{role}", "password": passwords[f"svc-{role}"],
                      "permissions": {"publish": {"allow": perms["publish"]},
                                      "subscribe": {"allow": perms["subscribe"]}}})
    for tenant in tenants:
        perms = tenant_permissions(s, tenant)
        users.append({"user": f"tenant-{tenant}", "password": passwords[f"tenant-{tenant}"],
                      "permissions": {"publish": {"allow": perms["publish"]},
                                      "subscribe": {"allow": perms["subscribe"]}}})
    return users


def render(s: Subjects, tenants: list[str], passwords: dict[str, str], *, store_dir: str | None = None,
           host: str = "0.0.0.0", port: int = 4222) -> str:
    """The config text. JSON is valid nats-server config syntax, so quoting is exact."""
    config: dict = {"host": host, "port": port, "jetstream": {"store_dir": store_dir} if store_dir else {},
                    "authorization": {"users": _users(s, tenants, passwords)}}
    return json.dumps(config, indent=2)


def generate_passwords(tenants: list[str]) -> dict[str, str]:
    names = [f"svc-{role}" for role in ("broker", "worker", "bridge")] + [f"tenant-{t}" for t in tenants]
    return {name: secrets.token_urlsafe(24) for name in names}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", action="append", default=[], help="a tenant name (repeat)")
    parser.add_argument("--settings", help="take tenant names from this settings TOML")
    parser.add_argument("--prefix", default="lw")
    parser.add_argument("--port", type=int, default=4222)
    parser.add_argument("--store-dir", default=None)
    parser.add_argument("--out", type=Path, required=True, help="nats-server config to write")
    parser.add_argument("--credentials-out", type=Path, required=True,
                        help="user → password JSON to hand out (keep secret)")


def run(args: argparse.Namespace) -> int:
    tenants = list(args.tenant)
    if args.settings:
        from broker.config import load_settings

        tenants += list(load_settings(Path(args.settings)).tenants)
    passwords = generate_passwords(tenants)
    for path, text in ((args.out, render(Subjects(args.prefix), tenants, passwords,
                                         store_dir=args.store_dir, port=args.port)),
                       (args.credentials_out, json.dumps(passwords, indent=2))):
        path.write_text(text)
        os.chmod(path, 0o600)
    print(f"wrote {args.out} ({len(tenants)} tenants, 3 service roles) and {args.credentials_out}")
    return 0
