"""docker-compose.yml's one-shot `nats-auth` service: who may connect to the NATS cluster.

It writes, into the `nats-auth` volume that the NATS nodes include (deploy/nats/nats-N.conf):
- nats-auth.conf: `accounts {...}`, laneway/nats_config.py's layout (the LANEWAY account with
  JetStream and the service users, an account of its own per tenant of the settings);
- nats-credentials.json: every user's password (hand the tenant users' out from here);
- cluster-auth.conf: the routes' credentials and the route URLs that carry them (nats-server
  authenticates an explicitly listed route only by the credentials in its URL);
- ca.pem, nats-tls.crt, nats-tls.key: the nodes' TLS, for clients and routes (deploy/nats/certs.py:
  a private CA, a certificate for every `--tls-names` name, kept across runs);
and, for each `--login ROLE=DIR`, DIR/ca.pem (the CA the role's services trust) and DIR/login.json
with that role's user and password alone: each role's containers mount only their own
(deploy/nats/login.py reads it), so a worker never holds the broker's or the operator's password.
The bridge's also carries the secret every bridge replica must share (LANEWAY_IDEMPOTENCY_SECRET:
Idempotency-Key → request id), kept in its login volume beside it, never in the volume the NATS
nodes read.

Passwords are kept across runs (`up_auth`, as `laneway up` keeps them): a rerun after a settings
change adds and removes tenants and leaves every other login valid. `laneway nats-config` would
make new ones on every run and lock out the running services. Reload the nodes after a rerun
(`docker compose kill -s HUP nats-1 nats-2 nats-3`); the TLS certificate is kept too, and when a
rerun replaces it (deploy/nats/certs.py), restart the nodes and the services instead.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path

import certs  # deploy/nats/certs.py, beside this script (mounted beside it in compose)

from core import env
from core.natsd import encryption_key
from core.settings import load_settings
from laneway.nats_config import up_auth, write_private
from laneway.nats_permissions import ROLES, user_name
from schemas.subjects import Subjects

ROUTE_USER = "route"
ACCOUNTS_FILE, CLUSTER_FILE, ROUTE_PASSWORD_FILE, LOGIN_FILE, IDEMPOTENCY_FILE = (
    "nats-auth.conf",
    "cluster-auth.conf",
    "route-password",
    "login.json",
    "idempotency.key",
)


def route_password(out: Path) -> str:
    path = out / ROUTE_PASSWORD_FILE
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    password = secrets.token_urlsafe(24)  # URL-safe: it goes into the route URLs as is
    write_private(path, password)
    return password


def cluster_auth(password: str, routes: list[str]) -> str:
    """The body of a node's `cluster {}` block: JSON values are nats-server config syntax."""
    urls = [f"nats-route://{ROUTE_USER}:{password}@{route}" for route in routes]
    return f"authorization: {json.dumps({'user': ROUTE_USER, 'password': password})}\nroutes: {json.dumps(urls)}\n"


def write(args: argparse.Namespace) -> None:
    tenants = list(load_settings(args.settings).tenants.values()) if args.settings else []
    auth = up_auth(Subjects(args.prefix), tenants, args.out)
    write_private(args.out / CLUSTER_FILE, cluster_auth(route_password(args.out), args.routes.split(",")))
    ca = certs.ensure(args.out, args.tls_names.split(","))
    logins = {user_name(role): login for role, login in auth.services.items()}
    uid, gid = (int(n) for n in args.owner.split(":"))
    for role, directory in args.login:
        user, password = logins[user_name(role)]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / certs.CA_FILE).write_bytes(ca)
        path = directory / LOGIN_FILE
        login = {"user": user, "password": password}
        if role == "bridge":  # made once, kept across runs: a retry maps to the same id
            login["env"] = {env.IDEMPOTENCY_SECRET.name: encryption_key(directory / IDEMPOTENCY_FILE)}
        write_private(path, json.dumps(login))
        if os.geteuid() == 0:  # root in the container: hand it to the service's user
            os.chown(path, uid, gid)
    print(f"nats-auth: {len(tenants)} tenant accounts, logins for {', '.join(r for r, _ in args.login)}")


def login(text: str) -> tuple[str, Path]:
    role, sep, directory = text.partition("=")
    if not sep or role not in ROLES:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ROLE=DIR, ROLE one of {', '.join(ROLES)}")
    return role, Path(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=Path, help="tenants from this settings TOML")
    parser.add_argument("--prefix", default="lw")
    parser.add_argument("--out", type=Path, required=True, help="the volume the NATS nodes include")
    parser.add_argument("--routes", required=True, help="HOST:PORT of every node, comma-separated")
    parser.add_argument(
        "--tls-names",
        required=True,
        help="the names clients and routes reach the nodes by, comma-separated (the certificate's)",
    )
    parser.add_argument("--login", type=login, action="append", default=[], help="ROLE=DIR (repeat)")
    parser.add_argument("--owner", default="10001:10001", help="UID:GID of the login files (the image's laneway user)")
    write(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
