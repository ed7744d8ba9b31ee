"""Provisioning: everything the services use but do not create themselves, in one run.

The topology (streams, the live buckets with the default classes, `core/topology.py`) and the
settings file's documents (a key per tenant, the models table, the price book), each tenant's
after what serves it: its subjects on the request stream and a brokers' consumer per class.
`laneway up` runs it before it starts anything; `laneway ops provision` runs it as the ops user
for compose and Kubernetes. By default a settings document is written only where its key never
had a value, so running it again cannot undo an operator's live edit or delete;
`overwrite` (`--overwrite`) writes the file over KV, an explicit operator choice.

The broker, the bridge and the workers open what it made and wait for it (`wait_provisioned`),
so they may start before it. Buckets a component keeps its own runtime state in (quota leases,
the response cache, the stored responses) are created by that component.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from core.connect import NatsSettings, connect_once
from core.metering import PRICES_KEY
from core.models import MODELS_KEY, encode_models
from core.policy import tenants as tenant_docs
from core.settings import Settings
from core.tasks import pause
from core.topology import BUCKETS, StreamLimits, ensure_intake, ensure_topology
from schemas.subjects import Subjects

log = logging.getLogger("laneway.provision")

WAIT_LOG_EVERY_S = 30.0  # while waiting, the "waiting for provisioning" line at most this often


async def provision(
    js: JetStreamContext, s: Subjects, limits: StreamLimits, settings: Settings, *, overwrite: bool = False
) -> None:
    await ensure_topology(js, s, limits)
    await ensure_intake(js, s, limits, tenants=list(settings.tenants))  # before a broker sees a document
    await (put_settings if overwrite else seed_settings)(js, s, settings)


NO_SUITABLE_PEERS = 10005  # JetStream: "no suitable peers for placement"


def not_ready_yet(exc: BaseException) -> bool:
    """What a run against NATS that is still starting meets, and a later run would not: no server
    answers; JetStream is not up (no responders) or has no meta leader yet (its API calls time
    out); a new cluster's peers have not all reported to the leader, so a replicated stream has no
    placement yet (also for good, with more replicas than servers: the caller bounds its wait)."""
    if isinstance(exc, nats.js.errors.APIError) and exc.err_code == NO_SUITABLE_PEERS:
        return True  # by its code alone, whatever status it comes with
    return isinstance(
        exc,
        (
            OSError,
            nats.errors.NoServersError,
            nats.errors.NoRespondersError,
            nats.errors.TimeoutError,
            nats.js.errors.ServiceUnavailableError,
        ),
    )


async def provision_at(n: NatsSettings, limits: StreamLimits, settings: Settings, *, overwrite: bool = False) -> None:
    """Connect (once, no reconnects: a one-shot run fails loudly), provision, disconnect."""

    async def error(exc: Exception) -> None:  # one line, not nats-py's default traceback
        log.warning("NATS: %s: %s", type(exc).__name__, exc)

    nc = await connect_once(n, "laneway-provision", error_cb=error)
    try:
        await provision(nc.jetstream(), n.subjects, limits, settings, overwrite=overwrite)
    finally:
        await nc.close()


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
        log.info(
            "settings file: kept KV's own %s (change them live, or apply the file with "
            "`laneway ops provision --overwrite`)",
            ", ".join(kept),
        )


async def put_settings(js: JetStreamContext, s: Subjects, settings: Settings) -> None:
    """Write every settings document over what KV holds (an operator's explicit choice)."""
    written = []
    for name, kv, key, value in await _documents(js, s, settings):
        await kv.put(key, value)
        written.append(name)
    if written:
        log.warning("settings file written over KV: %s", ", ".join(written))


# -- the services' side -----------------------------------------------------------------------
# JetStream not answering yet (a cluster electing its leader): wait as for what is missing.
_UNAVAILABLE = (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError)


async def _missing(js: JetStreamContext, s: Subjects, requests: bool, buckets: tuple[str, ...]) -> list[str]:
    missing = []
    if requests:
        try:  # the intake consumers come with it; one made later is waited for by its intake
            await js.stream_info(s.req_stream)
        except nats.js.errors.NotFoundError:
            missing.append(f"stream {s.req_stream}")
        except _UNAVAILABLE as exc:
            missing.append(f"JetStream ({type(exc).__name__})")
    for name in buckets:
        try:
            await js.key_value(s.bucket(name))
        except nats.js.errors.BucketNotFoundError:
            missing.append(f"bucket {s.bucket(name)}")
        except _UNAVAILABLE as exc:
            missing.append(f"bucket {s.bucket(name)} (JetStream: {type(exc).__name__})")
    return missing


async def wait_provisioned(
    js: JetStreamContext,
    s: Subjects,
    who: str,
    *,
    requests: bool = False,
    buckets: tuple[str, ...] = BUCKETS,
    interval_s: float = 0.25,
) -> None:
    """Until the live buckets it reads exist (`buckets`, each looked up with the caller's NATS
    rights) and the request stream, with `requests`. Waits rather than fails, so a
    service may start before provisioning ran, and says what it waits for."""
    loop = asyncio.get_running_loop()
    next_log = loop.time()
    while missing := await _missing(js, s, requests, buckets):
        if loop.time() >= next_log:
            log.warning(
                "%s: waiting for provisioning (missing %s): run `laneway ops provision`", who, ", ".join(missing)
            )
            next_log = loop.time() + WAIT_LOG_EVERY_S
        await pause(interval_s)
