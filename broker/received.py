"""Each request id is received once per tenant: a dedup key that only its tenant can occupy.

JetStream's duplicate window is one per stream and keyed by the `Nats-Msg-Id` header alone,
which the publisher writes. With the key `<tenant>:<request_id>`, acme could store a message of
its own under `globex:order-1`, and for the next 120 s globex's request with that id was answered
`duplicate` and never stored (issue 35). Nothing in nats-server ties that header to the subject:
subject transforms and account imports rewrite subjects, never headers, and the stream's dedup
map is one per stream. So the stream's dedup only keeps a retried publish to one copy (its id is
random: `schemas.subjects.MSG_ID_HEADER`), and the id is deduplicated here, under a key made from
what the server did enforce, the request subject's tenant:

    verdict = await received.claim(tenant, request, delivery)

creates `<tenant>.<request_id>` in `lw_received` (value: the first copy's stream sequence and
`Nats-Msg-Id`), living until the request's deadline and at least `WINDOW_S`:

- the key is new, or holds this very message (a redelivery): `FIRST`, admit it;
- it holds another copy of the same publish (the same `Nats-Msg-Id`: stored twice past the
  stream's window), or of the same escalation (a worker that escalated twice): `COPY`, dropped
  without an answer, since the first answers on the same reply subject;
- it holds another publish of the same id: `DUPLICATE`, refused `duplicate_request`.

One KV create on the intake path per request (a get too for a copy).
"""

from __future__ import annotations

import enum
import math
import time

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from schemas.requests import GenerateRequest
from schemas.subjects import Subjects, received_key

RECEIVED_BUCKET = "received"
WINDOW_S = 120.0  # JetStream's default duplicate window: an Idempotency-Key's 409 lasts as long
STREAM_IN_USE = 10058  # the bucket exists with another configuration (an operator's change)


class Verdict(enum.Enum):
    FIRST = "first"
    COPY = "copy"
    DUPLICATE = "duplicate"


class Receipt(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The message that first claimed an id."""

    stream_seq: int
    msg_id: str = ""


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Receipt).decode


def verdict(held: Receipt, mine: Receipt, escalated: bool) -> Verdict:
    """`mine` found the id held by `held`."""
    if held.stream_seq == mine.stream_seq:
        return Verdict.FIRST  # redelivered: the message that claimed it
    if escalated or (mine.msg_id and held.msg_id == mine.msg_id):
        return Verdict.COPY
    return Verdict.DUPLICATE


def ttl_s(request: GenerateRequest, now: float) -> int:
    """The key outlives every copy that could still be served: none is after its deadline."""
    return math.ceil(max(request.deadline - now, WINDOW_S))


class Copy(Exception):
    """Another copy of a message already received (`Verdict.COPY`): dropped without an answer."""

    def __init__(self, tenant: str, request_id: str, stream_seq: int) -> None:
        super().__init__(f"{tenant}/{request_id}: stream message {stream_seq} is a copy of one received")
        self.tenant = tenant
        self.request_id = request_id
        self.stream_seq = stream_seq


class Received:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, s: Subjects, replicas: int = 1) -> Received:
        """History 1, no bucket TTL: each key brings its own (`ttl_s`)."""
        config = KeyValueConfig(
            bucket=s.bucket(RECEIVED_BUCKET), history=1, storage=StorageType.FILE, replicas=replicas
        )
        try:
            return cls(await js.create_key_value(config))
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != STREAM_IN_USE:
                raise
            return cls(await js.key_value(config.bucket))

    async def claim(
        self, tenant: str, request: GenerateRequest, stream_seq: int, msg_id: str | None, escalated: bool
    ) -> Verdict:
        key = received_key(tenant, request.request_id, escalated)
        mine = Receipt(stream_seq, msg_id or "")
        for _ in range(2):  # the key may expire between a failed create and the get
            try:
                await self._kv.create(key, _encode(mine), msg_ttl=ttl_s(request, time.time()))
                return Verdict.FIRST
            except nats.js.errors.KeyWrongLastSequenceError:
                pass
            try:
                entry = await self._kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                continue
            assert entry.value is not None  # a get's entry carries its message's data
            return verdict(_decode(entry.value), mine, escalated)
        return Verdict.FIRST  # it expired twice in a row: no copy holds it now
