"""Streams, the brokers' consumers (one per priority class and tenant) and KV buckets, created
idempotently.

Provisioning (`core/provision.py`: `laneway up`, `laneway ops provision`) calls `ensure_topology`,
then, once the settings file's tenants are in KV, `ensure_intake`; creating what exists is a
no-op, and a changed limit is applied with an update (JetStream allows raising/lowering limits in
place). The services only open what it made. A class or a tenant set live (`laneway classes|
tenants set`, as ops) gets its consumers, and a tenant its subjects on the request stream, there,
before the document exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from core.kvwatch import current_keys
from core.policy import classes as class_docs
from core.policy import tenants as tenant_docs
from core.policy.classes import DEFAULT_CLASSES
from core.policy.tenants import Tenant
from schemas.subjects import Subjects

BUCKETS = ("classes", "tenants", "routing")
NO_STORAGE = 10047  # JetStream: "insufficient storage resources available"


@dataclass(frozen=True)
class StreamLimits:
    """LW_REQ limits. The per-subject cap is the per-(class, tenant) backlog: publishes beyond
    it are refused by JetStream itself (discard-new per subject), which the edge turns into 429."""

    max_age_s: float = 3600.0
    dedup_window_s: float = 120.0
    max_msgs_per_subject: int = 2048
    max_msgs: int = 1_000_000
    max_bytes: int = 4 * 1024**3
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    max_ack_pending: int = 50_000
    replicas: int = 1
    # LW_DLQ keeps a dead letter this long: long enough to look into a failure, short enough that
    # what a record holds (redacted when the PII stage is on) does not pile up.
    dlq_max_age_s: float = 7 * 86400.0
    # ... and at most this much, the oldest going first: a sender's flood of junk must not fill the
    # disk. Per subject (class, tenant) first, so a flood rolls over its sender's own records
    # before the whole stream's cap reaches anyone else's. JetStream reserves max_bytes on disk.
    dlq_max_msgs_per_subject: int = 10_000
    dlq_max_msgs: int = 100_000
    dlq_max_bytes: int = 256 * 1024**2


class StorageRefused(RuntimeError):
    """JetStream could not reserve a stream's storage: it reserves each stream's `max_bytes` at
    creation against its file-storage limit, by default 75% of the disk's free space at start."""

    def __init__(self, stream: str, max_bytes: int | None) -> None:
        asked = (
            f"it could not reserve max_bytes={max_bytes / 1024**3:.2f} GiB of file storage"
            if max_bytes and max_bytes > 0
            else "no file storage was left for it"
        )
        super().__init__(
            f"JetStream refused stream {stream}: {asked}. Free disk space where nats-server stores "
            "its data, raise its jetstream max_file_store, or lower --max-stream-gib (the request "
            "stream's reservation)"
        )
        self.stream, self.max_bytes = stream, max_bytes


def request_stream(s: Subjects, limits: StreamLimits, tenants: list[str]) -> StreamConfig:
    return StreamConfig(
        name=s.req_stream,
        subjects=s.req_stream_subjects(tenants),
        retention=RetentionPolicy.WORK_QUEUE,  # a message lives until acked or terminated
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,  # a full stream refuses new work: nothing accepted is dropped
        discard_new_per_subject=True,
        max_msgs_per_subject=limits.max_msgs_per_subject,
        max_msgs=limits.max_msgs,
        max_bytes=limits.max_bytes,
        max_age=limits.max_age_s,
        duplicate_window=limits.dedup_window_s,
        num_replicas=limits.replicas,
    )


def intake_consumer(s: Subjects, klass: str, tenant: str, limits: StreamLimits) -> ConsumerConfig:
    """One tenant's requests in one class, for every broker's intake of them (broker/intakes.py).
    JetStream delivers a consumer's messages in stream order, so whatever shares a consumer waits
    in one line: per class, a chat stored behind 10,000 batch requests would wait for the broker to
    take them all; per tenant, one tenant's chat would wait behind another's backlog (or junk)."""
    name = s.intake_durable(klass, tenant)
    return ConsumerConfig(
        name=name,
        durable_name=name,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=limits.ack_wait_s,
        max_deliver=limits.max_deliver,
        max_ack_pending=limits.max_ack_pending,
        max_waiting=64,
        filter_subjects=s.intake_filters(klass, tenant),
    )


def _log_stream(s: Subjects, name: str, subject: str, limits: StreamLimits, max_age: float) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=[subject],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=max_age,
        num_replicas=limits.replicas,
    )


def dead_letter_stream(s: Subjects, limits: StreamLimits) -> StreamConfig:
    """LW_DLQ: a log, capped by age, count and bytes, per subject and in all; discard old. An
    install made before the caps gets them on its next provisioning (`_ensure_stream` updates
    it, and JetStream drops the oldest records over them)."""
    return replace(
        _log_stream(s, s.dlq_stream, s.dlq_all, limits, limits.dlq_max_age_s),
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=limits.dlq_max_msgs_per_subject,
        max_msgs=limits.dlq_max_msgs,
        max_bytes=limits.dlq_max_bytes,
    )


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            # "stream name already in use with a different configuration": apply the new limits.
            if exc.err_code != 10058:
                raise
            await js.update_stream(config)
    except nats.js.errors.ServerError as exc:
        if exc.err_code != NO_STORAGE:
            raise
        raise StorageRefused(config.name or "", config.max_bytes) from None


async def ensure_topology(js: JetStreamContext, s: Subjects, limits: StreamLimits) -> None:
    """Streams and buckets, and the default classes. The request stream's subjects and the
    consumers follow the tenants, which the settings file writes next: `ensure_intake`."""
    await _ensure_stream(js, request_stream(s, limits, await _tenant_names(js, s, missing_ok=True)))
    await _ensure_stream(js, _log_stream(s, s.usage_stream, s.usage_all, limits, 90 * 86400))
    await _ensure_stream(js, dead_letter_stream(s, limits))
    await _ensure_stream(js, _log_stream(s, s.audit_stream, f"{s.prefix}.audit.*", limits, 365 * 86400))
    for name in BUCKETS:
        await js.create_key_value(
            KeyValueConfig(
                bucket=s.bucket(name),
                history=16 if name == "routing" else 5,
                storage=StorageType.FILE,
                replicas=limits.replicas,
            )
        )
    classes = await js.key_value(s.bucket("classes"))
    for policy in DEFAULT_CLASSES:
        try:
            await classes.create(policy.name, class_docs.encode(policy))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # an operator's value wins over the defaults


async def ensure_intake(
    js: JetStreamContext,
    s: Subjects,
    limits: StreamLimits | None = None,
    *,
    classes: Iterable[str] = (),
    tenants: Iterable[str] = (),
) -> None:
    """The request stream takes every tenant's requests (those in KV and `tenants`), and each
    (class, tenant) pair has its consumer (classes in KV and `classes`). Without `limits`, what is
    made takes those of what provisioning made (`laneway classes|tenants set` do not know the
    flags of `up`). A consumer is made before its class or tenant document exists, so the
    brokers find it when they see the document."""
    all_tenants = sorted({*await _tenant_names(js, s), *tenants})
    all_classes = sorted({*await current_keys(await js.key_value(s.bucket("classes"))), *classes})
    existing = {info.name: info for info in await js.consumers_info(s.req_stream)}
    if limits is None:
        limits = _provisioned_limits(existing.values())
    stream = (await js.stream_info(s.req_stream)).config
    if sorted(stream.subjects or ()) != sorted(s.req_stream_subjects(all_tenants)):
        await js.update_stream(replace(stream, subjects=s.req_stream_subjects(all_tenants)))
    for name in s.legacy_durables(all_classes):
        if name in existing:  # what it delivered and nobody acked goes to the new consumers
            await js.delete_consumer(s.req_stream, name)
    for klass in all_classes:
        for tenant in all_tenants:
            config = intake_consumer(s, klass, tenant, limits)
            if config.name not in existing or _changed(existing[config.name].config, config):
                await js.add_consumer(s.req_stream, config)


async def _tenant_names(js: JetStreamContext, s: Subjects, missing_ok: bool = False) -> list[str]:
    try:
        return await current_keys(await js.key_value(s.bucket("tenants")))
    except nats.js.errors.BucketNotFoundError:
        if missing_ok:  # a first provisioning: the bucket comes next
            return []
        raise


def _changed(have: ConsumerConfig, want: ConsumerConfig) -> bool:
    return (have.ack_wait, have.max_deliver, have.max_ack_pending, sorted(have.filter_subjects or ())) != (
        want.ack_wait,
        want.max_deliver,
        want.max_ack_pending,
        sorted(want.filter_subjects or ()),
    )


def _provisioned_limits(consumers) -> StreamLimits:
    for info in consumers:
        c = info.config
        return replace(
            StreamLimits(), ack_wait_s=c.ack_wait, max_deliver=c.max_deliver, max_ack_pending=c.max_ack_pending
        )
    return StreamLimits()


async def put_tenants(js: JetStreamContext, s: Subjects, tenants: list[Tenant]) -> None:
    """Tenant documents, each after its intake (`ensure_intake`): served once the brokers see it."""
    await ensure_intake(js, s, tenants=[t.name for t in tenants])
    kv = await js.key_value(s.bucket("tenants"))
    for tenant in tenants:
        await kv.put(tenant.name, tenant_docs.encode(tenant))
