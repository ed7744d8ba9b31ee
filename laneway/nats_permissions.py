"""Who may publish and subscribe to what on NATS: each service role's `permissions` block, and
each tenant user's. laneway/nats_config.py places these users in their accounts.

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
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.batch.store import BATCHES_BUCKET
from bridge.files.store import FILE_DATA_BUCKET, FILES_BUCKET
from broker.gate.quota.store import QUOTA_BUCKET
from broker.received import RECEIVED_BUCKET
from broker.scheduler.lease import LEASE_BUCKET
from core.cache import CACHE_BUCKET
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
    return [
        *_api("CONSUMER.CREATE", *streams),
        *(f"{a}.>" for a in _api("CONSUMER.CREATE", *streams)),
        *(f"{a}.*" for a in _api("CONSUMER.INFO", *streams)),
        *(f"$JS.FC.{stream}.>" for stream in streams),
    ]


def _kv_read(*streams: str) -> list[str]:
    """Open a bucket (stream info) and get a key (direct get, or message get when not direct)."""
    return [*_api("STREAM.INFO STREAM.MSG.GET", *streams), *(f"{a}.>" for a in _api("DIRECT.GET", *streams))]


def _permissions(publish: list[str], subscribe: list[str], *, responses: bool = False) -> dict:
    block: dict = {"publish": {"allow": list(dict.fromkeys(publish))}, "subscribe": {"allow": subscribe}}
    if responses:
        block["allow_responses"] = True  # one reply to a request it received, within 2 minutes
    return block


def service_permissions(s: Subjects) -> dict[str, dict]:
    """role → its nats-server `permissions` block."""
    p = s.prefix
    req = s.req_stream
    intakes = f"{req}.*"  # the intake consumers (core/topology.py): one token per (class, tenant)
    kv = {
        name: f"KV_{s.bucket(name)}"
        for name in (
            *LIVE_BUCKETS,
            CACHE_BUCKET,
            QUOTA_BUCKET,
            LEASE_BUCKET,
            RESPONSES_BUCKET,
            BACKGROUND_BUCKET,
            RECEIVED_BUCKET,
            STORAGE_BUCKET,
        )
    }
    live = [kv[name] for name in LIVE_BUCKETS]
    logs = [s.usage_stream, s.dlq_stream, s.audit_stream]
    file_data = f"OBJ_{s.bucket(FILE_DATA_BUCKET)}"
    batch_state = [
        f"KV_{s.bucket(FILES_BUCKET)}",
        f"KV_{s.bucket(BATCHES_BUCKET)}",
        file_data,
        s.batch_stream,
        kv[STORAGE_BUCKET],
    ]
    # Provisioning (core/provision.py: `laneway ops provision`, `laneway up`) runs as ops: create
    # or (limits changed) update the streams, open the buckets, write the default classes
    # (`kv.create` reads the key when it exists: found on a rerun) and the settings file's
    # documents; give the request stream each tenant's subjects and create each (class, tenant)
    # consumer (`laneway classes|tenants set` too: copying the limits of the others, which it
    # lists), and delete the consumers of installs made before them (one, then one per class:
    # named by their class, so by any one token).
    provision = [
        *_api("STREAM.CREATE STREAM.UPDATE", req, *logs, *live),
        *_kv_read(*live),
        f"$JS.API.STREAM.INFO.{req}",
        f"$JS.API.CONSUMER.CREATE.{intakes}",
        f"$JS.API.CONSUMER.LIST.{req}",
        f"$JS.API.CONSUMER.DELETE.{intakes}",
    ]
    acks = f"$JS.ACK.{intakes}.>"  # the dispatched message's ack/nak/+WPI/term
    frames, usage, dlq = f"{p}.tok.*.*", s.usage_all, f"{p}.dlq.*.*"
    inbox = {role: f"{service_inbox(user_name(role))}.>" for role in ROLES}  # its own replies only
    return {
        "broker": _permissions(
            [
                frames,
                usage,
                dlq,
                f"{p}.audit.*",
                s.broker_events,
                s.worker_ping,
                acks,
                *_kv_read(*live),
                f"$JS.API.STREAM.INFO.{req}",  # waits for provisioning to make it
                *_api("STREAM.CREATE", kv[CACHE_BUCKET], kv[QUOTA_BUCKET]),
                *_api("STREAM.UPDATE", kv[CACHE_BUCKET]),  # a changed cache TTL
                *_kv_read(kv[CACHE_BUCKET], kv[QUOTA_BUCKET]),
                f"$KV.{s.bucket(QUOTA_BUCKET)}.>",
                *_consume(*live),
                f"$JS.API.CONSUMER.MSG.NEXT.{intakes}",  # broker/intakes.py
                *_api("STREAM.MSG.GET STREAM.MSG.DELETE", req),  # broker/deadletter.py
                # broker/received.py: each request id once per tenant
                *_api("STREAM.CREATE", kv[RECEIVED_BUCKET]),
                *_kv_read(kv[RECEIVED_BUCKET]),
                f"$KV.{s.bucket(RECEIVED_BUCKET)}.>",
                # broker/scheduler: the lease bucket, admissions, settled notices, announcements
                *_api("STREAM.CREATE", kv[LEASE_BUCKET]),
                *_kv_read(kv[LEASE_BUCKET]),
                f"$KV.{s.bucket(LEASE_BUCKET)}.>",
                s.sched_admit,
                s.sched_settled_all,
                s.sched_leader,
                s.fence_all,  # a lost worker's requests, taken back
                s.worker_alive_all,  # probes the workers running its dispatches
            ],
            [
                s.pull_all,
                s.cancel_all,
                s.worker_events,
                s.worker_ping,
                usage,
                inbox["broker"],
                f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{intakes}",
                s.broker_events,
                s.sched_admit,
                s.sched_settled_all,
                s.sched_leader,
            ],
            responses=True,  # the Batch answering a worker's pull
        ),
        "worker": _permissions(
            [
                frames,
                s.pull_all,
                usage,
                dlq,
                s.worker_events,
                acks,
                s.cont_all,  # a redelivery asks its edge how it goes on
                s.alive_all,  # probes the bridges awaiting its work
                s.req_escalated_all,  # the cascade re-sends for the large pool
                *_api("STREAM.INFO", kv[CACHE_BUCKET], kv["routing"]),
                f"$KV.{s.bucket(CACHE_BUCKET)}.>",  # stores deterministic answers
                *_consume(kv["routing"]),  # watches the price book
            ],
            [
                s.cancel_all,
                s.worker_ping,
                s.sched_leader,  # a new scheduler: pull afresh
                inbox["worker"],
                s.fence_all,  # judged lost: drop what went elsewhere
                s.worker_alive_all,  # its liveness, as the scheduler probes it
            ],
        ),
        "bridge": _permissions(
            [
                s.req_all,
                s.cancel_all,
                s.worker_ping,
                *_kv_read(*live),
                *_consume(*live),
                f"$KV.{s.bucket('routing')}.>",  # the admin API's rules
                # The Files and Batch APIs' state (bridge/files/store.py, bridge/batch/store.py): the
                # bridges create it; a file's delete and a finalized batch purge their own subjects.
                *_api("STREAM.CREATE STREAM.INFO", *batch_state),
                *_kv_read(*batch_state),
                *_consume(*batch_state),
                *_api("STREAM.PURGE", file_data, s.batch_stream),
                "$JS.API.STREAM.NAMES",  # nats-py's object get finds the chunks' stream by subject
                f"$KV.{s.bucket(FILES_BUCKET)}.>",
                f"$KV.{s.bucket(BATCHES_BUCKET)}.>",
                f"$O.{s.bucket(FILE_DATA_BUCKET)}.>",
                s.batch_done_all,
                f"$KV.{s.bucket(STORAGE_BUCKET)}.>",  # each tenant's storage, counted (laneway usage)
                usage,  # a batch line run again: which run is billed (bridge/batch/run.py)
                # stored responses (bridge/responses/stored/): the bridge creates the bucket, reads and writes it;
                # and the running background responses' list, which every bridge watches (takeover.py)
                *_api("STREAM.CREATE", kv[RESPONSES_BUCKET], kv[BACKGROUND_BUCKET]),
                *_kv_read(kv[RESPONSES_BUCKET]),
                f"$KV.{s.bucket(RESPONSES_BUCKET)}.>",
                *_kv_read(kv[BACKGROUND_BUCKET]),
                *_consume(kv[BACKGROUND_BUCKET]),
                f"$KV.{s.bucket(BACKGROUND_BUCKET)}.>",
                s.resume_all,  # resumes between replicas (bridge/resume/relay.py)
            ],
            [
                frames,
                s.worker_events,
                s.broker_events,
                inbox["bridge"],
                s.resume_all,
                s.alive_all,  # its liveness, as workers probe it (workers/orphans.py)
                s.cont_all,  # workers' asks (bridge/streams/continuation.py)
            ],
            responses=True,  # ... answered to the asking worker's inbox
        ),
        "ops": _permissions(
            [
                *provision,
                *_kv_read(*live, *logs),
                *_consume(*live, *logs),
                *_api("STREAM.INFO", req),  # the queue's depth, never its messages
                *(f"$KV.{s.bucket(name)}.>" for name in LIVE_BUCKETS),
                *_kv_read(kv[LEASE_BUCKET]),  # which broker schedules now
                *_kv_read(kv[RESPONSES_BUCKET]),  # a stored response, read (never written)
                *_kv_read(kv[STORAGE_BUCKET]),  # what each tenant stores, counted (laneway usage)
            ],
            [inbox["ops"]],
        ),
    }


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
