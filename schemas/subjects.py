"""Names of every subject, stream and bucket, built from one configurable prefix.

Subject tokens (class, tenant, pool, ids) must be plain NATS tokens: no dots, spaces or
wildcards. `check_token` is the one place that enforces it, so a tenant called `a.b` can never
publish onto another tenant's subject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ESCALATED = "esc"  # the last token of an escalated request's subject


class BadToken(ValueError):
    def __init__(self, what: str, value: str) -> None:
        super().__init__(f"{what} {value!r} is not a valid subject token (letters, digits, '_' or '-', 1-64 chars)")
        self.what = what
        self.value = value


def check_token(what: str, value: str) -> str:
    if not _TOKEN.fullmatch(value):  # `$` alone would let a final newline through
        raise BadToken(what, value)
    return value


@dataclass(frozen=True, slots=True)
class Subjects:
    """All names derive from `prefix` (default `lw`); streams and buckets are upper/lower-cased forms."""

    prefix: str = "lw"

    # -- streams and buckets ---------------------------------------------------------------
    @property
    def req_stream(self) -> str:
        return f"{self.prefix.upper()}_REQ"

    @property
    def usage_stream(self) -> str:
        return f"{self.prefix.upper()}_USAGE"

    @property
    def dlq_stream(self) -> str:
        return f"{self.prefix.upper()}_DLQ"

    @property
    def audit_stream(self) -> str:
        return f"{self.prefix.upper()}_AUDIT"

    def bucket(self, name: str) -> str:
        """KV bucket names: `classes`, `tenants`, `routing`, `cache` → `lw_classes`, ..."""
        return f"{self.prefix}_{name}"

    @property
    def batch_stream(self) -> str:
        """Finished lines of running batches, until each batch is finalized into its files."""
        return f"{self.prefix.upper()}_BATCH"

    def legacy_durables(self, classes: list[str]) -> list[str]:
        """The consumers of installs from before per-(class, tenant) intake: one on the whole
        request stream, then one per class. Provisioning deletes them: a work queue's consumers
        may not overlap."""
        return [f"{self.prefix}-broker", *(f"{self.prefix}-req-{klass}" for klass in classes)]

    def intake_durable(self, klass: str, tenant: str) -> str:
        """The brokers' consumer of one tenant's requests in one class (broker/intakes.py). `~`
        joins the two because no token may hold it: no two pairs share a name."""
        return f"{self.intake_durable_prefix}{check_token('class', klass)}~{check_token('tenant', tenant)}"

    @property
    def intake_durable_prefix(self) -> str:
        return f"{self.prefix}-in-"

    def intake_filters(self, klass: str, tenant: str) -> list[str]:
        """One tenant's requests in one class, direct and escalated (the consumer's filter)."""
        return [self.req(klass, tenant), self.req_escalated(klass, tenant)]

    # -- subjects ---------------------------------------------------------------------------
    def req(self, klass: str, tenant: str) -> str:
        return f"{self.prefix}.req.{klass}.{tenant}"

    @property
    def req_all(self) -> str:
        return f"{self.prefix}.req.*.*"

    def req_escalated(self, klass: str, tenant: str) -> str:
        """A request a worker hands to a larger pool (the cascade). Only workers may publish
        here: a tenant's account imports `req(*, tenant)` alone, so `escalated` is never a
        tenant's word."""
        return f"{self.req(klass, tenant)}.{ESCALATED}"

    @property
    def req_escalated_all(self) -> str:
        return f"{self.req_all}.{ESCALATED}"

    def req_stream_subjects(self, tenants: list[str]) -> list[str]:
        """What LW_REQ stores: the requests of the tenants with a document, and no other's. A
        request for a tenant that has none finds no stream (the publisher is told at once), where
        it would otherwise wait for an intake that nobody pulls. With no tenant at all, the stream
        listens on its own name only (JetStream's default), which nobody publishes to."""
        return [
            subject
            for tenant in sorted(set(tenants))
            for subject in (self.req("*", check_token("tenant", tenant)), self.req_escalated("*", tenant))
        ]

    def parse_req(self, subject: str) -> tuple[str, str, bool]:
        """`lw.req.<class>.<tenant>[.esc]` → (class, tenant, escalated)."""
        escalated = subject.endswith(f".{ESCALATED}")
        parts = subject.removesuffix(f".{ESCALATED}").rsplit(".", 2)
        if len(parts) != 3 or parts[0] != f"{self.prefix}.req":
            raise BadToken("request subject", subject)
        return parts[1], parts[2], escalated

    def pull(self, pool: str) -> str:
        return f"{self.prefix}.pull.{pool}"

    @property
    def pull_all(self) -> str:
        return f"{self.prefix}.pull.*"

    def tok(self, tenant: str, edge_id: str) -> str:
        """The reply inbox of one edge for one tenant; an edge subscribes to `tok_edge(edge_id)`."""
        return f"{self.prefix}.tok.{tenant}.{edge_id}"

    def tok_edge(self, edge_id: str) -> str:
        return f"{self.prefix}.tok.*.{edge_id}"

    def tok_tenant_prefix(self, tenant: str) -> str:
        """Workers publish frames only under this prefix of the request's own tenant."""
        return f"{self.prefix}.tok.{tenant}."

    def cont(self, reply_to: str) -> str | None:
        """Where a worker asks the edge behind `reply_to` (`lw.tok.<tenant>.<edge>`) how a stream
        goes on after its worker was lost (schemas/continuation.py); None: not an edge's inbox."""
        parts = reply_to.split(".")
        if len(parts) != self.prefix.count(".") + 4 or not reply_to.startswith(f"{self.prefix}.tok."):
            return None
        return f"{self.prefix}.cont.{parts[-2]}.{parts[-1]}"

    def cont_edge(self, edge_id: str) -> str:
        return f"{self.prefix}.cont.*.{edge_id}"

    @property
    def cont_all(self) -> str:
        return f"{self.prefix}.cont.*.*"

    def cancel(self, tenant: str, request_id: str) -> str:
        return f"{self.prefix}.cancel.{tenant}.{request_id}"

    def parse_cancel(self, subject: str) -> tuple[str, str]:
        """`lw.cancel.<tenant>.<request_id>` → (tenant, request_id): a cancel acts on the tenant
        its subject names (the one its publisher may use), never on one its payload claims."""
        parts = subject.rsplit(".", 2)
        if len(parts) != 3 or parts[0] != f"{self.prefix}.cancel":
            raise BadToken("cancel subject", subject)
        return parts[1], parts[2]

    @property
    def cancel_all(self) -> str:
        return f"{self.prefix}.cancel.*.*"

    def alive(self, edge_id: str) -> str:
        """A bridge subscribes here for as long as it lives and never answers: a worker's probe gets
        nats-server's "no responders" once that bridge's connection is gone (workers/orphans.py).
        Services only: no tenant account imports it, so no tenant can keep a dead bridge alive."""
        return f"{self.prefix}.alive.{check_token('edge', edge_id)}"

    @property
    def alive_all(self) -> str:
        return f"{self.prefix}.alive.*"

    def worker_alive(self, worker_id: str) -> str:
        """A worker holds this while connected and never answers: the scheduler's probe gets "no
        responders" once its connection is gone (broker/worker_probes.py). Services only."""
        return f"{self.prefix}.alive.w.{check_token('worker', worker_id)}"

    @property
    def worker_alive_all(self) -> str:
        return f"{self.prefix}.alive.w.*"

    def fence(self, worker_id: str) -> str:
        """The requests the scheduler took back from a worker it judged lost (`schemas.work.Fence`).
        Services only."""
        return f"{self.prefix}.fence.{check_token('worker', worker_id)}"

    @property
    def fence_all(self) -> str:
        return f"{self.prefix}.fence.*"

    def usage(self, tenant: str) -> str:
        return f"{self.prefix}.usage.{tenant}"

    @property
    def usage_all(self) -> str:
        return f"{self.prefix}.usage.*"

    def audit(self, tenant: str) -> str:
        return f"{self.prefix}.audit.{tenant}"

    def dlq(self, klass: str, tenant: str) -> str:
        return f"{self.prefix}.dlq.{klass}.{tenant}"

    @property
    def dlq_all(self) -> str:
        return f"{self.prefix}.dlq.>"

    def batch_done(self, tenant: str, batch_id: str) -> str:
        """One batch's finished lines (bridges only: no tenant account imports it)."""
        return f"{self.prefix}.batch.done.{tenant}.{batch_id}"

    @property
    def batch_done_all(self) -> str:
        return f"{self.prefix}.batch.done.*.*"

    def worker_event(self, worker_id: str) -> str:
        return f"{self.prefix}.evt.worker.{worker_id}"

    @property
    def worker_events(self) -> str:
        return f"{self.prefix}.evt.worker.*"

    def broker_event(self, broker_id: str) -> str:
        return f"{self.prefix}.evt.broker.{broker_id}"

    @property
    def broker_events(self) -> str:
        return f"{self.prefix}.evt.broker.*"

    # -- the scheduler: one broker at a time holds its lease (broker/scheduler/) ---------------
    @property
    def sched_admit(self) -> str:
        """Admitted requests, gate → scheduler; only the lease holder subscribes."""
        return f"{self.prefix}.sched.admit"

    def sched_settled(self, broker_id: str) -> str:
        return f"{self.prefix}.sched.settled.{broker_id}"

    @property
    def sched_settled_all(self) -> str:
        return f"{self.prefix}.sched.settled.*"

    @property
    def sched_leader(self) -> str:
        """A new scheduler's id (origins re-forward, workers re-pull); empty: the lease was given up."""
        return f"{self.prefix}.sched.leader"

    # -- resuming a stream at another bridge replica (bridge/resume/relay.py) -------------------------
    def resume(self, edge_id: str) -> str:
        """Asks (and releases) to the bridge holding a stream: its edge id is in the stream's
        event ids. Bridges only: no tenant account imports or may reach it."""
        return f"{self.prefix}.resume.{edge_id}"

    def resume_reply(self, edge_id: str, nonce: str) -> str:
        """Where the holder relays the events, to the asking bridge (one subject per resume)."""
        return f"{self.prefix}.resume.{edge_id}.{nonce}"

    @property
    def resume_all(self) -> str:
        return f"{self.prefix}.resume.>"

    @property
    def worker_ping(self) -> str:
        """Workers answer with an immediate heartbeat: a new edge learns who is ready at once."""
        return f"{self.prefix}.evt.ping"


# A publish's `Nats-Msg-Id` is random (uuid4 hex), and kept by that publish's retries, so
# JetStream stores a retried publish once. Its duplicate window is one per stream, keyed by this
# header alone: a key anyone could write (`<tenant>:<request_id>`, before issue 35) let one tenant
# store its message under another's and have that one's request dropped as a duplicate. That a
# request id is served once per tenant is the broker's (`received_key`, broker/received.py).
MSG_ID_HEADER = "Nats-Msg-Id"
# The bridges' stored responses (`/v1/responses` with `store`), one key per response:
# `<tenant>.<response id>`, so a tenant's reads are confined to its own keys.
RESPONSES_BUCKET = "responses"
# The background responses running now, by the same keys, each with its request (`Rerun`): every
# bridge watches the keys for one whose bridge is gone, and reads the request to run it again.
BACKGROUND_BUCKET = "background"
# What each tenant keeps at rest (`StorageUsage`), key `<tenant>`: the bridges write it, `ops` reads it.
STORAGE_BUCKET = "storage"


def tenant_key(tenant: str, what: str, ident: str) -> str:
    """`<tenant>.<id>`: the KV key (or object name) of a tenant's stored object, so a tenant's
    reads are confined to its own keys. Every id Laneway gives out is one token; any other (`*`,
    `>`, `a.b`, a space) is one nobody was given: `BadToken`, which stores answer as unknown."""
    return f"{check_token('tenant', tenant)}.{check_token(what, ident)}"


def stored_response_key(tenant: str, response_id: str) -> str:
    return tenant_key(tenant, "response id", response_id)


_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def service_inbox(user: str | None) -> str:
    """The inbox prefix of a Laneway process logged in as `user`: `_INBOX_<user>`, which its
    generated permissions allow, and no other service's. With the shared `_INBOX`, any service
    user could read every other's replies (a worker the broker's JetStream fetches, the ops
    user's answers). Without a user (no auth) the default."""
    return "_INBOX" if not user else f"_INBOX_{_NOT_TOKEN.sub('_', user)}"


def received_key(tenant: str, request_id: str, escalated: bool = False) -> str:
    """`<tenant>.<request_id>` in the broker's received bucket: the tenant is the request
    subject's, which nats-server enforced, so only that tenant's requests can occupy its keys."""
    key = tenant_key(tenant, "request id", request_id)
    return f"{key}.{ESCALATED}" if escalated else key
