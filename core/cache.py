"""The exact-match response cache for deterministic requests, shared at run time: the gate looks
answers up (its cache stage, `broker/gate/pipeline.py`), workers store them (`workers/cache.py`).

Only a request whose answer is a function of its input is cached: temperature 0, or a fixed
seed (`Sampling.deterministic`). The key is the SHA-256 of, in a fixed msgpack layout:
  - the tenant scope: `t:<tenant>`, or `g:<group>` when the tenant is configured into a share
    group (`CacheScope`); the prefixes keep a tenant and a group of the same name apart;
  - the logical model AND the resolved model version, so a new model misses;
  - the whole OpenAI body AFTER redaction, as the engine gets it (messages or prompt, tools,
    tool_choice, response_format, n, logprobs, every sampling field) and its verbatim extra
    fields; only `stream`, `stream_options` and `user` are left out, as they change the
    framing, not the answer. So the cache is never keyed on raw PII, and two prompts that
    redact alike share an answer the engine produced from that same redacted text.
Normalizing means a canonical encoding only; text is not rewritten (that would change answers).

Entries live in the KV bucket `lw_cache` whose bucket-level TTL expires them. A hit is replayed
through `replay_entries` as the Delta entries the engine produced (tool calls, logprobs and
choices included) and a Finished, so a client sees a normal stream.
The cache is an optimization: a failed lookup is a miss and a failed store is only logged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from schemas.frames import Delta, Entry, Finished, TokenUsage
from schemas.openai import Body, EmbeddingBody
from schemas.requests import GenerateRequest, Token
from schemas.subjects import Subjects
from schemas.usage import Usage

log = logging.getLogger("laneway.cache")

CACHE_BUCKET = "cache"
KEY_VERSION = 2  # bump to orphan every entry when the key layout changes


class CacheScope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which tenants share cache entries: tenant → group. Unlisted tenants share with nobody."""

    groups: dict[Token, Token] = {}

    def scope(self, tenant: str) -> str:
        group = self.groups.get(tenant)
        return f"g:{group}" if group is not None else f"t:{tenant}"


def prefix_salt(scope: str) -> str:
    """The engine prefix-cache salt for a tenant scope (vLLM's `cache_salt`): tenants who share
    answers share prefixes; anyone else gets a separate cache, so one tenant cannot learn from
    timing whether another's prompt prefix is cached."""
    return hashlib.sha256(f"laneway-prefix\0{scope}".encode()).hexdigest()[:24]


class CachedResponse(msgspec.Struct, array_like=True, gc=False):
    deltas: list[Delta]  # as the engine produced them (ids and seqs are re-stamped on replay)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "tool_calls"
    served_model: str = ""  # the real model that produced it
    created_at: float = 0.0
    finish_reasons: list[str] = []
    vectors: list[bytes] = []  # an embedding's answer

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)


CACHEABLE_FINISH = ("stop", "length", "tool_calls")

_key_encoder = msgspec.msgpack.Encoder()
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(CachedResponse).decode


def cache_key(scope: str, model: str, model_version: str, body: Body, extra: bytes) -> str | None:
    """The entry's key, or None when the request must not be cached (not deterministic)."""
    if not body.deterministic:
        return None
    framing = {} if isinstance(body, EmbeddingBody) else {"stream": False, "stream_options": None}
    answer_fields = msgspec.structs.replace(body, user=None, **framing)
    layout = (KEY_VERSION, scope, model, model_version, answer_fields, extra)
    return hashlib.sha256(_key_encoder.encode(layout)).hexdigest()


async def ensure_cache_bucket(
    js: JetStreamContext, s: Subjects, ttl_s: float, replicas: int = 1, max_bytes: int | None = None
) -> KeyValue:
    """Create `lw_cache` (history 1, direct gets for fast reads) or apply a changed TTL/size."""
    config = KeyValueConfig(
        bucket=s.bucket(CACHE_BUCKET),
        history=1,
        ttl=ttl_s,
        max_bytes=max_bytes,
        storage=StorageType.FILE,
        replicas=replicas,
        direct=True,
    )
    try:
        return await js.create_key_value(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != 10058:  # "stream name already in use with a different configuration"
            raise
    stream = f"KV_{config.bucket}"
    info = await js.stream_info(stream)
    current = info.config
    current.max_age, current.max_bytes = ttl_s, max_bytes if max_bytes is not None else current.max_bytes
    await js.update_stream(current)
    return await js.key_value(config.bucket)


class ResponseCache:
    """Lookups (broker) and stores (worker) against one `lw_cache` bucket. Values stay well
    under NATS `max_payload` (1 MiB default): a hit is replayed in one frame."""

    def __init__(self, kv: KeyValue, scope: CacheScope | None = None, max_value_bytes: int = 512 * 1024) -> None:
        self.kv = kv
        self.scopes = scope or CacheScope()
        self._max_value = max_value_bytes
        self.hits = self.misses = self.stores = 0

    @classmethod
    async def open(
        cls, js: JetStreamContext, s: Subjects, ttl_s: float, scope: CacheScope | None = None, replicas: int = 1
    ) -> ResponseCache:
        return cls(await ensure_cache_bucket(js, s, ttl_s, replicas), scope)

    def key(self, tenant: str, model: str, model_version: str, body: Body, extra: bytes) -> str | None:
        """Key for a request as it will reach the engine (already redacted); None: not cacheable."""
        return cache_key(self.scopes.scope(tenant), model, model_version, body, extra)

    async def lookup(self, key: str | None) -> CachedResponse | None:
        if key is None:
            return None
        try:
            entry = await self.kv.get(key)
            cached = _decode(entry.value) if entry.value else None
        except nats.js.errors.KeyNotFoundError:
            cached = None
        except (nats.errors.Error, msgspec.DecodeError) as exc:
            log.warning("cache lookup failed, treating as a miss: %s", exc)
            cached = None
        if cached is None:
            self.misses += 1
        else:
            self.hits += 1
        return cached

    async def store(self, key: str | None, response: CachedResponse) -> bool:
        """Store a finished, complete answer; cancelled or failed generations never are."""
        if key is None or response.finish_reason not in CACHEABLE_FINISH:
            return False
        if not response.created_at:
            response.created_at = time.time()
        value = _encode(response)
        if len(value) > self._max_value:
            return False
        try:
            await self.kv.put(key, value)
        except nats.errors.Error as exc:
            log.warning("cache store failed: %s", exc)
            return False
        self.stores += 1
        return True


def replay_entries(
    cached: CachedResponse, request_id: str, attempt: int, headers: dict[str, str] | None = None
) -> list[Entry]:
    """A cache hit as the entries a worker would have sent: Deltas with seq 0..n-1 (the first
    with the client's `headers`), then Finished."""
    entries: list[Entry] = [
        msgspec.structs.replace(
            d, request_id=request_id, attempt=attempt, seq=seq, headers=(headers or {}) if seq == 0 else {}
        )
        for seq, d in enumerate(cached.deltas)
    ]
    entries.append(
        Finished(
            request_id,
            attempt,
            len(entries),
            cached.finish_reason,
            TokenUsage(cached.prompt_tokens, cached.completion_tokens),
            cached.served_model,
            cached.finish_reasons,
            cached.vectors,
            (headers or {}) if not entries else {},
        )
    )
    return entries


def replay_usage(cached: CachedResponse, request: GenerateRequest, pool: str) -> Usage:
    """The usage record of a cache hit: metered as cached, with no GPU time."""
    return Usage(
        request_id=request.request_id,
        tenant=request.tenant,
        klass=request.klass,
        model=request.model,
        served_model=cached.served_model,
        pool=pool,
        worker_id="cache",
        prompt_tokens=cached.prompt_tokens,
        completion_tokens=cached.completion_tokens,
        finish_reason=cached.finish_reason,
        queued_s=0.0,
        ttft_s=0.0,
        total_s=0.0,
        finished_at=time.time(),
        cached=True,
    )


def parse_scope(raw: Mapping[str, str] | bytes) -> CacheScope:
    """A `[cache.groups]` table or a JSON document → `CacheScope`; ValueError names the field."""
    try:
        if isinstance(raw, (bytes, bytearray)):
            return msgspec.json.decode(raw, type=CacheScope)
        return msgspec.convert({"groups": dict(raw)}, CacheScope)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"cache share groups: {exc}") from None
