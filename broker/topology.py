"""Streams, the broker's durable consumer and KV buckets, created idempotently at start.

Every process calls `ensure_topology`; creating what exists is a no-op, and a changed limit is
applied with an update (JetStream allows raising/lowering limits in place).
"""

from __future__ import annotations

import logging

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from broker import classes as class_docs
from broker import tenants as tenant_docs
from broker.classes import DEFAULT_CLASSES
from broker.config import Settings, StreamLimits
from broker.models import MODELS_KEY, encode_models
from broker.tenants import Tenant
from broker.usage.meter import PRICES_KEY
from schemas.subjects import Subjects

log = logging.getLogger("laneway.topology")

BUCKETS = ("classes", "tenants", "routing")


def request_stream(s: Subjects, limits: StreamLimits) -> StreamConfig:
    return StreamConfig(
        name=s.req_stream,
        subjects=[s.req_all],
        retention=RetentionPolicy.WORK_QUEUE,   # a message lives until acked or terminated
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,              # a full stream refuses new work: nothing accepted is dropped
        discard_new_per_subject=True,
        max_msgs_per_subject=limits.max_msgs_per_subject,
        max_msgs=limits.max_msgs,
        max_bytes=limits.max_bytes,
        max_age=limits.max_age_s,
        duplicate_window=limits.dedup_window_s,
        num_replicas=limits.replicas,
    )


def broker_consumer(s: Subjects, limits: StreamLimits) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=s.broker_durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=limits.ack_wait_s,
        max_deliver=limits.max_deliver,
        max_ack_pending=limits.max_ack_pending,
        max_waiting=64,
        filter_subject=s.req_all,
    )


def _log_stream(s: Subjects, name: str, subject: str, limits: StreamLimits, max_age: float) -> StreamConfig:
    return StreamConfig(name=name, subjects=[subject], retention=RetentionPolicy.LIMITS,
                        storage=StorageType.FILE, max_age=max_age, num_replicas=limits.replicas)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        # "stream name already in use with a different configuration": apply the new limits.
        if exc.err_code != 10058:
            raise
        await js.update_stream(config)


async def ensure_topology(js: JetStreamContext, s: Subjects, limits: StreamLimits) -> None:
    await _ensure_stream(js, request_stream(s, limits))
    await _ensure_stream(js, _log_stream(s, s.usage_stream, s.usage_all, limits, 90 * 86400))
    await _ensure_stream(js, _log_stream(s, s.dlq_stream, s.dlq_all, limits, limits.dlq_max_age_s))
    await _ensure_stream(js, _log_stream(s, s.audit_stream, f"{s.prefix}.audit.*", limits, 365 * 86400))
    await js.add_consumer(s.req_stream, broker_consumer(s, limits))
    for name in BUCKETS:
        await js.create_key_value(KeyValueConfig(
            bucket=s.bucket(name), history=16 if name == "routing" else 5,
            storage=StorageType.FILE, replicas=limits.replicas))
    classes = await js.key_value(s.bucket("classes"))
    for policy in DEFAULT_CLASSES:
        try:
            await classes.create(policy.name, class_docs.encode(policy))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # an operator's value wins over the defaults


async def put_tenants(js: JetStreamContext, s: Subjects, tenants: list[Tenant]) -> None:
    kv = await js.key_value(s.bucket("tenants"))
    for tenant in tenants:
        await kv.put(tenant.name, tenant_docs.encode(tenant))


# -- the settings file into KV ----------------------------------------------------------------
async def _documents(js: JetStreamContext, s: Subjects, settings: Settings) -> list[tuple[str, KeyValue, str, bytes]]:
    """("bucket/key", bucket, key, value) for what the settings file provisions: a key per
    tenant, the models table and the price book as one key each. Each bucket is opened once."""
    tenants, routing = await js.key_value(s.bucket("tenants")), await js.key_value(s.bucket("routing"))
    docs = [(f"tenants/{t.name}", tenants, t.name, tenant_docs.encode(t)) for t in settings.tenants.values()]
    if settings.models:
        docs.append((f"routing/{MODELS_KEY}", routing, MODELS_KEY, encode_models(dict(settings.models))))
    if settings.prices.pools:
        docs.append((f"routing/{PRICES_KEY}", routing, PRICES_KEY, msgspec.json.encode(settings.prices)))
    return docs


async def seed_settings(js: JetStreamContext, s: Subjects, settings: Settings) -> None:
    """Write each settings document only where its key never had a value. Expecting subject
    sequence 0 (not KV `create`, which re-creates a deleted key) keeps an operator's delete too."""
    created, kept = [], []
    for name, kv, key, value in await _documents(js, s, settings):
        try:
            await kv.update(key, value, last=0)
        except nats.js.errors.KeyWrongLastSequenceError:
            kept.append(name)
        else:
            created.append(name)
    if created:
        log.info("settings file: created %s", ", ".join(created))
    if kept:
        log.info("settings file: kept KV's own %s (change them live, or apply the file with "
                 "`laneway bridge --settings-overwrite`)", ", ".join(kept))


async def put_settings(js: JetStreamContext, s: Subjects, settings: Settings) -> None:
    """Write every settings document over what KV holds (an operator's explicit choice)."""
    written = []
    for name, kv, key, value in await _documents(js, s, settings):
        await kv.put(key, value)
        written.append(name)
    if written:
        log.warning("settings file written over KV: %s", ", ".join(written))
