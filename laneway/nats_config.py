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

Services get the subjects their code uses, found by reading it and by running every feature
under these roles until the server logged no permission violation
(tests/integration/test_nats_isolation.py keeps it so). JetStream API rights are granted per
verb and per stream: no role may delete or purge a stream, and only the broker may take the
work queue's messages (`CONSUMER.MSG.NEXT`) or remove one (the DLQ move).

The `ops` user is for the operator commands (`laneway ops provision|classes|tenants|routing|usage|
eval`, via LANEWAY_NATS_USER/LANEWAY_NATS_PASSWORD): it alone creates and updates the streams, the
broker's durable consumer and the live buckets (provisioning); it writes classes, tenants and
routing rules, and reads the usage, audit and dead-letter streams. It cannot touch requests or
tokens. The services create only the buckets of their own runtime state (quota, response cache,
the request ids the brokers received, the bridge's stored responses and its count of what each
tenant stores, which ops may read).

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

from bridge.batch.store import BATCHES_BUCKET
from bridge.files.store import FILE_DATA_BUCKET, FILES_BUCKET
from broker.gate.quota.store import QUOTA_BUCKET
from broker.received import RECEIVED_BUCKET
from broker.scheduler.lease import LEASE_BUCKET
from core.cache import CACHE_BUCKET
from core.policy.tenants import Tenant
from core.topology import BUCKETS as LIVE_BUCKETS  # classes, tenants, routing: watched live
from schemas.subjects import BACKGROUND_BUCKET, RESPONSES_BUCKET, STORAGE_BUCKET, Subjects, check_token, service_inbox

SERVICE_ROLES = ("broker", "worker", "bridge")
ROLES = (*SERVICE_ROLES, "ops")


def user_name(role: str) -> str:
    return "ops" if role == "ops" else f"svc-{role}"


def tenant_user(tenant: str) -> str:
    return f"tenant-{check_token('tenant', tenant)}"


# -- permissions ------------------------------------------------------------------------------
def _api(verbs: str, *streams: str) -> list[str]:
    """`$JS.API.<verb>.<stream>` for each verb (space-separated) and stream."""
    return [f"$JS.API.{verb}.{stream}" for verb in verbs.split() for stream in streams]


def _consume(*streams: str) -> list[str]:
    """Ephemeral ordered consumers (KV watches, `kv.keys()`, stream reads): create them (nats-py
    asks without a name; `.>` is the same right as clients that name them ask for it), check
    them when heartbeats stop, and answer flow control (`$JS.FC.<stream>.<consumer>.*`, sent
    when a reader falls megabytes behind). They end by unsubscribing, never by a delete."""
    return [*_api("CONSUMER.CREATE", *streams), *(f"{a}.>" for a in _api("CONSUMER.CREATE", *streams)),
            *(f"{a}.*" for a in _api("CONSUMER.INFO", *streams)),
            *(f"$JS.FC.{stream}.>" for stream in streams)]


def _kv_read(*streams: str) -> list[str]:
    """Open a bucket (stream info) and get a key (direct get, or message get when not direct)."""
    return [*_api("STREAM.INFO STREAM.MSG.GET", *streams), *(f"{a}.>" for a in _api("DIRECT.GET", *streams))]


def _permissions(publish: list[str], subscribe: list[str], *, responses: bool = False) -> dict:
    block: dict = {"publish": {"allow": list(dict.fromkeys(publish))}, "subscribe": {"allow": subscribe}}
    if responses:
        block["allow_responses"] = True     # one reply to a request it received, within 2 minutes
    return block


def service_permissions(s: Subjects) -> dict[str, dict]:
    """role → its nats-server `permissions` block."""
    p = s.prefix
    req = s.req_stream
    intakes = f"{req}.*"        # the intake consumers (core/topology.py): one token per (class, tenant)
    kv = {name: f"KV_{s.bucket(name)}" for name in (*LIVE_BUCKETS, CACHE_BUCKET, QUOTA_BUCKET, LEASE_BUCKET,
                                                      RESPONSES_BUCKET, BACKGROUND_BUCKET, RECEIVED_BUCKET,
                                                      STORAGE_BUCKET)}
    live = [kv[name] for name in LIVE_BUCKETS]
    logs = [s.usage_stream, s.dlq_stream, s.audit_stream]
    file_data = f"OBJ_{s.bucket(FILE_DATA_BUCKET)}"
    batch_state = [f"KV_{s.bucket(FILES_BUCKET)}", f"KV_{s.bucket(BATCHES_BUCKET)}", file_data, s.batch_stream,
                   kv[STORAGE_BUCKET]]
    # Provisioning (core/provision.py: `laneway ops provision`, `laneway up`) runs as ops: create
    # or (limits changed) update the streams, open the buckets, write the default classes
    # (`kv.create` reads the key when it exists: found on a rerun) and the settings file's
    # documents; give the request stream each tenant's subjects and create each (class, tenant)
    # consumer (`laneway classes|tenants set` too: copying the limits of the others, which it
    # lists), and delete the consumers of installs made before them (one, then one per class:
    # named by their class, so by any one token).
    provision = [*_api("STREAM.CREATE STREAM.UPDATE", req, *logs, *live), *_kv_read(*live),
                 f"$JS.API.STREAM.INFO.{req}", f"$JS.API.CONSUMER.CREATE.{intakes}",
                 f"$JS.API.CONSUMER.LIST.{req}", f"$JS.API.CONSUMER.DELETE.{intakes}"]
    acks = f"$JS.ACK.{intakes}.>"     # the dispatched message's ack/nak/+WPI/term
    frames, usage, dlq = f"{p}.tok.*.*", s.usage_all, f"{p}.dlq.*.*"
    inbox = {role: f"{service_inbox(user_name(role))}.>" for role in ROLES}     # its own replies only
    return {
        "broker": _permissions(
            [frames, usage, dlq, f"{p}.audit.*", s.broker_events, s.worker_ping, acks, *_kv_read(*live),
             f"$JS.API.STREAM.INFO.{req}",                     # waits for provisioning to make it
             *_api("STREAM.CREATE", kv[CACHE_BUCKET], kv[QUOTA_BUCKET]),
             *_api("STREAM.UPDATE", kv[CACHE_BUCKET]),         # a changed cache TTL
             *_kv_read(kv[CACHE_BUCKET], kv[QUOTA_BUCKET]), f"$KV.{s.bucket(QUOTA_BUCKET)}.>",
             *_consume(*live),
             f"$JS.API.CONSUMER.MSG.NEXT.{intakes}",               # broker/intakes.py
             *_api("STREAM.MSG.GET STREAM.MSG.DELETE", req),        # broker/deadletter.py
             # broker/received.py: each request id once per tenant
             *_api("STREAM.CREATE", kv[RECEIVED_BUCKET]), *_kv_read(kv[RECEIVED_BUCKET]),
             f"$KV.{s.bucket(RECEIVED_BUCKET)}.>",
             # broker/scheduler: the lease bucket, admissions, settled notices, announcements
             *_api("STREAM.CREATE", kv[LEASE_BUCKET]), *_kv_read(kv[LEASE_BUCKET]),
             f"$KV.{s.bucket(LEASE_BUCKET)}.>", s.sched_admit, s.sched_settled_all, s.sched_leader,
             s.fence_all,                                   # a lost worker's requests, taken back
             s.worker_alive_all],                           # probes the workers running its dispatches
            [s.pull_all, s.cancel_all, s.worker_events, s.worker_ping, usage, inbox["broker"],
             f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{intakes}",
             s.broker_events, s.sched_admit, s.sched_settled_all, s.sched_leader],
            responses=True),   # the Batch answering a worker's pull
        "worker": _permissions(
            [frames, s.pull_all, usage, dlq, s.worker_events, acks,
             s.cont_all,                                    # a redelivery asks its edge how it goes on
             s.alive_all,                                   # probes the bridges awaiting its work
             s.req_escalated_all,                           # the cascade re-sends for the large pool
             *_api("STREAM.INFO", kv[CACHE_BUCKET], kv["routing"]),
             f"$KV.{s.bucket(CACHE_BUCKET)}.>",             # stores deterministic answers
             *_consume(kv["routing"])],                     # watches the price book
            [s.cancel_all, s.worker_ping, s.sched_leader, inbox["worker"],   # a new scheduler: pull afresh
             s.fence_all,                                   # judged lost: drop what went elsewhere
             s.worker_alive_all]),                          # its liveness, as the scheduler probes it
        "bridge": _permissions(
            [s.req_all, s.cancel_all, s.worker_ping, *_kv_read(*live), *_consume(*live),
             f"$KV.{s.bucket('routing')}.>",                                    # the admin API's rules
             # The Files and Batch APIs' state (bridge/files/store.py, bridge/batch/store.py): the
             # bridges create it; a file's delete and a finalized batch purge their own subjects.
             *_api("STREAM.CREATE STREAM.INFO", *batch_state), *_kv_read(*batch_state), *_consume(*batch_state),
             *_api("STREAM.PURGE", file_data, s.batch_stream),
             "$JS.API.STREAM.NAMES",        # nats-py's object get finds the chunks' stream by subject
             f"$KV.{s.bucket(FILES_BUCKET)}.>", f"$KV.{s.bucket(BATCHES_BUCKET)}.>",
             f"$O.{s.bucket(FILE_DATA_BUCKET)}.>", s.batch_done_all,
             f"$KV.{s.bucket(STORAGE_BUCKET)}.>",       # each tenant's storage, counted (laneway usage)
             usage,                 # a batch line run again: which run is billed (bridge/batch/run.py)
             # stored responses (bridge/responses/stored/): the bridge creates the bucket, reads and writes it;
             # and the running background responses' list, which every bridge watches (takeover.py)
             *_api("STREAM.CREATE", kv[RESPONSES_BUCKET], kv[BACKGROUND_BUCKET]), *_kv_read(kv[RESPONSES_BUCKET]),
             f"$KV.{s.bucket(RESPONSES_BUCKET)}.>", *_kv_read(kv[BACKGROUND_BUCKET]), *_consume(kv[BACKGROUND_BUCKET]),
             f"$KV.{s.bucket(BACKGROUND_BUCKET)}.>",
             s.resume_all],                             # resumes between replicas (bridge/resume/relay.py)
            [frames, s.worker_events, s.broker_events, inbox["bridge"], s.resume_all,
             s.alive_all,                                   # its liveness, as workers probe it (workers/orphans.py)
             s.cont_all],                               # workers' asks (bridge/streams/continuation.py)
            responses=True),                            # ... answered to the asking worker's inbox
        "ops": _permissions(
            [*provision, *_kv_read(*live, *logs), *_consume(*live, *logs),
             *_api("STREAM.INFO", req),                     # the queue's depth, never its messages
             *(f"$KV.{s.bucket(name)}.>" for name in LIVE_BUCKETS),
             *_kv_read(kv[LEASE_BUCKET]),                   # which broker schedules now
             *_kv_read(kv[RESPONSES_BUCKET]),               # a stored response, read (never written)
             *_kv_read(kv[STORAGE_BUCKET])],                # what each tenant stores, counted (laneway usage)
            [inbox["ops"]]),
    }


SERVICE_ACCOUNT = "LANEWAY"


def tenant_account(tenant: str) -> str:
    return f"TENANT_{check_token('tenant', tenant)}"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """Per tenant account, and so per tenant user: a tenant holds a few connections (one per
    service replica) with a few subscriptions each (one inbox per client, PubAck inboxes)."""

    max_connections: int = 64
    max_subscriptions: int = 1024
    max_payload: int = 1024 * 1024      # nats-server's default; the server's own limit still applies

    def block(self) -> dict:
        return {"max_connections": self.max_connections, "max_subscriptions": self.max_subscriptions,
                "max_payload": self.max_payload}


def tenant_classes(tenants: Iterable[str | Tenant]) -> dict[str, tuple[str, ...]]:
    """tenant → the classes its NATS user may publish requests in: a document's `classes`; a
    bare name gets a new tenant's default classes. A name listed twice is a config error: the
    first one counts."""
    found: dict[str, tuple[str, ...]] = {}
    for t in tenants:
        doc = t if isinstance(t, Tenant) else Tenant(name=check_token("tenant", t))
        found.setdefault(doc.name, tuple(dict.fromkeys(check_token("class", c) for c in doc.classes)))
    return found


def tenant_subjects(s: Subjects, tenant: str, classes: Iterable[str]) -> tuple[list[str], str, str]:
    """The tenant's protocol: (its request subject in each of `classes`, cancels, tokens)."""
    check_token("tenant", tenant)
    requests = [s.req(check_token("class", klass), tenant) for klass in classes]
    return requests, s.cancel(tenant, "*"), f"{s.tok_tenant_prefix(tenant)}>"


def tenant_permissions(s: Subjects, tenant: str, classes: Iterable[str]) -> dict:
    """Within its own account: publish only its requests and cancels, read its tokens and the
    PubAcks of its publishes (`_INBOX.>`, nats-py's default; `_INBOX_<tenant>.>` for clients
    configured with that prefix before tenants had accounts)."""
    requests, cancels, tokens = tenant_subjects(s, tenant, classes)
    return _permissions([*requests, cancels], [tokens, "_INBOX.>", f"_INBOX_{tenant}.>"])


def tenant_exports(s: Subjects, tenant: str, classes: Iterable[str]) -> list[dict]:
    """What the service account offers this tenant's account, and no other."""
    requests, cancels, tokens = tenant_subjects(s, tenant, classes)
    to = [tenant_account(tenant)]
    return [*({"service": r, "accounts": to, "response_type": "singleton"} for r in requests),  # one PubAck
            {"service": cancels, "accounts": to},
            {"stream": tokens, "accounts": to}]


def tenant_imports(s: Subjects, tenant: str, classes: Iterable[str]) -> list[dict]:
    requests, cancels, tokens = tenant_subjects(s, tenant, classes)
    return [*({"service": {"account": SERVICE_ACCOUNT, "subject": r}} for r in requests),
            {"service": {"account": SERVICE_ACCOUNT, "subject": cancels}},
            {"stream": {"account": SERVICE_ACCOUNT, "subject": tokens}}]


def _user(name: str, passwords: dict[str, str], permissions: dict) -> dict:
    return {"user": name, "password": passwords[name], "permissions": permissions}


def accounts(s: Subjects, tenants: Iterable[str | Tenant], passwords: dict[str, str],
             limits: TenantLimits = TenantLimits()) -> dict:
    """The `accounts` map: the service account with JetStream and every role's user, and one
    account per tenant with its user, its imports and its limits. A tenant is its document (its
    classes are what its user may publish in) or a bare name (a new tenant's default classes)."""
    classes = tenant_classes(tenants)
    services = {"jetstream": "enabled",
                "users": [_user(user_name(role), passwords, perms)
                          for role, perms in service_permissions(s).items()],
                "exports": [export for t, c in classes.items() for export in tenant_exports(s, t, c)]}
    result: dict[str, dict] = {SERVICE_ACCOUNT: services}
    for t, c in classes.items():
        result[tenant_account(t)] = {"users": [_user(tenant_user(t), passwords, tenant_permissions(s, t, c))],
                                     "imports": tenant_imports(s, t, c), "limits": limits.block()}
    return result


def user_names(tenants: Iterable[str]) -> list[str]:
    return [user_name(role) for role in ROLES] + [tenant_user(t) for t in tenants]


def generate_passwords(tenants: Iterable[str]) -> dict[str, str]:
    return {name: secrets.token_urlsafe(24) for name in user_names(tenants)}


def accounts_block(s: Subjects, tenants: Iterable[str | Tenant], passwords: dict[str, str],
                   limits: TenantLimits = TenantLimits()) -> str:
    """`accounts {...}` alone: a whole config, or a file to `include` in one. JSON is valid
    nats-server config syntax as a map value, so quoting is exact."""
    return "accounts " + json.dumps(accounts(s, tenants, passwords, limits), indent=2) + "\n"


def render(s: Subjects, tenants: Iterable[str | Tenant], passwords: dict[str, str], *, store_dir: str | None = None,
           host: str = "0.0.0.0", port: int = 4222, limits: TenantLimits = TenantLimits()) -> str:
    """A whole config, for `laneway nats-config`."""
    config: dict = {"host": host, "port": port, "jetstream": {"store_dir": store_dir} if store_dir else {},
                    "accounts": accounts(s, tenants, passwords, limits)}
    return json.dumps(config, indent=2)


def write_private(path: Path, text: str) -> None:
    """Write a secret file that is never readable by others, not even for a moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)    # O_CREAT's mode does not apply to a file that already existed
        f.write(text)
    os.replace(tmp, path)


# -- laneway up -------------------------------------------------------------------------------
AUTH_FILE = "nats-auth.conf"
CREDENTIALS_FILE = "nats-credentials.json"


@dataclass(frozen=True, slots=True)
class UpAuth:
    authorization_file: Path                    # `accounts {...}`: -c it, or include it
    credentials_file: Path                      # user → password JSON, as `nats-config` writes it
    services: dict[str, tuple[str, str]]        # broker|worker|bridge|ops → (user, password)
    tenants: dict[str, tuple[str, str]]         # tenant → (user, password)


def up_auth(s: Subjects, tenants: Iterable[str | Tenant], data_dir: Path) -> UpAuth:
    """Users for `laneway up`'s nats-server, in `data_dir`. Passwords already in its credentials
    file are kept, so a restart on the same data dir works with the same credentials; a new
    tenant gets a new one and a tenant no longer listed loses its user. Tenants as `accounts`
    takes them: documents (their classes), or names (the default classes)."""
    tenants = list(tenants)
    names = list(tenant_classes(tenants))       # a user listed twice is a config error: once here
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
    return UpAuth(auth_path, creds_path,
                  {role: (user_name(role), passwords[user_name(role)]) for role in ROLES},
                  {t: (tenant_user(t), passwords[tenant_user(t)]) for t in names})


# -- laneway nats-config ----------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", action="append", default=[],
                        help="a tenant name (repeat); its user may publish in the default classes")
    parser.add_argument("--settings", help="take tenants, and the classes each may use, from this settings TOML")
    parser.add_argument("--prefix", default="lw")
    parser.add_argument("--port", type=int, default=4222)
    parser.add_argument("--store-dir", default=None)
    parser.add_argument("--out", type=Path, required=True, help="nats-server config to write")
    parser.add_argument("--credentials-out", type=Path, required=True,
                        help="user → password JSON to hand out (keep secret)")


def run(args: argparse.Namespace) -> int:
    tenants: list[str | Tenant] = []
    if args.settings:
        from core.settings import load_settings

        tenants += load_settings(Path(args.settings)).tenants.values()
    tenants = [*tenants, *args.tenant]      # a name the settings list keeps the settings' classes
    passwords = generate_passwords(tenant_classes(tenants))
    write_private(args.out, render(Subjects(args.prefix), tenants, passwords,
                                   store_dir=args.store_dir, port=args.port))
    write_private(args.credentials_out, json.dumps(passwords, indent=2))
    print(f"wrote {args.out} ({len(passwords) - len(ROLES)} tenants, {len(ROLES)} roles: {', '.join(ROLES)}) "
          f"and {args.credentials_out}")
    return 0
