"""The PII stage of the broker's gate: analyse every text of a request that reaches an engine
or the hosted API behind it (`slots.py` says where: messages, their names, content parts, tool
calls and their ids, tools and their schemas, the response format, stop sequences, a
completion's prompt, the texts to embed, `user`, and every string and key of the fields Laneway
does not type and of those the edge stores beside the answer, `kept`), apply the tenant's
policy, and say what was done. A part no analyser reads (an image, audio, a file) is refused
for a tenant whose policy looks for anything.

Speed comes from not repeating work: a chat resends its whole history every turn, so results are
cached by (tenant, policy version, text hash) and only texts never seen before go to the pool,
each once however often the request repeats it. The cache holds offsets and scores, never text.

Bounds, so that one tenant cannot take the stage from the others: a request whose texts add up
to more than `max_chars` characters is refused before any of it is analysed (`PiiTooLarge`), and
each tenant's jobs hold at most its share of the pool's processes (`broker/share.py`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from broker.config import DEFAULT_PII_MAX_CHARS
from broker.gate.pii.audit import AuditSpan, PiiAudit
from broker.gate.pii.edit import edited, edited_extra, split
from broker.gate.pii.redact import Replacer, apply
from broker.gate.pii.slots import Found, Slot, collect
from broker.pii_analysis.plan import Hit, Plan, plan_for
from broker.pii_analysis.pool import PiiEngine
from core.policy.pii import Action, TenantPiiPolicy, fingerprint
from core.policy.pii.errors import PiiBlocked, PiiError, PiiRefused, PiiUnavailable
from core.policy.pii.stream import StreamRedactor
from schemas import codec
from schemas.openai import Body, ChatBody, Message
from schemas.requests import GenerateRequest

Verdict = Literal["pass", "redacted", "blocked"]
_decode_value = msgspec.json.Decoder().decode  # a member of `extra`, as plain values


class PiiTooLarge(PiiError):
    """The texts a request puts before the model add up to more than the broker analyses for one
    request: refused before analysis, whatever the policy says (its limit is the operator's)."""

    code = "pii_too_large"

    def __init__(self, chars: int, limit: int, param: str) -> None:
        self.chars, self.limit = chars, limit
        self.param = param  # the top-level field holding the most of that text
        super().__init__(
            f"this request has {chars} characters of text to analyse for PII, most of them in "
            f"{param}; this broker analyses at most {limit} per request"
        )


@dataclass(frozen=True, slots=True)
class Finding:
    entity_type: str
    message_index: int  # the first index on the field's path: the message's, the stop sequence's, ...
    start: int  # offsets in the original text of the slot
    end: int
    score: float
    action: Action
    part: str = "messages"  # the top-level request field
    param: str = "messages"  # where, as OpenAI names it: "messages[2].name", "tools[0].function.parameters"


@dataclass(frozen=True, slots=True)
class PiiDecision:
    action: Verdict
    body: Body  # what may go on: redacted (and, if blocked, fully redacted)
    findings: list[Finding]
    tenant: str
    policy: str  # policy fingerprint
    mode: str  # "ner" | "regex"
    analyzed: int = 0  # texts sent to the pool for this request
    cached: int = 0  # texts answered from the cache (or repeated in the request)
    unavailable: str | None = None  # set when analysis failed and the policy failed open
    entity_types: list[str] = field(default_factory=list)
    cpu_ms: float = 0.0  # pool CPU on the critical path (slowest job); 0 if all cached
    extra: bytes = b""  # the request's other fields, redacted like `body`
    refusal: PiiRefused | None = None  # refused whatever the findings say
    kept: bytes = b""  # what the edge stores beside the answer, redacted like `body`

    @property
    def messages(self) -> list[Message]:
        return self.body.messages if isinstance(self.body, ChatBody) else []

    @property
    def stop(self) -> list[str]:
        return self.body.stops

    def raise_if_blocked(self) -> None:
        if self.refusal is not None:
            raise self.refusal
        if self.action == "blocked":
            blocked = [f for f in self.findings if f.action is Action.block]
            raise PiiBlocked([f.entity_type for f in blocked], blocked[0].param)

    def redacted(self, request: GenerateRequest) -> GenerateRequest:
        """`request` as it may go on: its body and extra fields replaced by the redacted ones (a
        blocked request comes back fully redacted too, without what could not be analysed)."""
        if self.body is request.body and self.extra is request.extra and self.kept is request.kept:
            return request
        kind = "chat" if request.chat is not None else "completion" if request.completion is not None else "embedding"
        return msgspec.structs.replace(request, **{kind: self.body}, extra=self.extra, kept=self.kept)

    def audit(self, request_id: str, at: float | None = None) -> PiiAudit:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.entity_type] = counts.get(f.entity_type, 0) + 1
        return PiiAudit(
            request_id=request_id,
            tenant=self.tenant,
            action=self.action,
            entity_types=self.entity_types,
            counts=counts,
            spans=[
                AuditSpan(f.message_index, f.entity_type, f.start, f.end, f.action.value, f.part, f.param)
                for f in self.findings
            ],
            policy=self.policy,
            mode=self.mode,
            analyzed_messages=self.analyzed,
            cached_messages=self.cached,
            unavailable=self.unavailable,
            at=time.time() if at is None else at,
        )


class PiiGate:
    """`async with PiiGate() as gate: decision = await gate.inspect(tenant, policy, messages)`.

    `hash_key` keys the `hash` action's pseudonyms; give every broker replica the same secret so
    a value maps to the same pseudonym whichever replica saw it (a random key is used if absent:
    fine for one process, not for a fleet). `max_chars` bounds the text of one request;
    `share` the pool's processes one tenant's jobs hold at once (None: half, rounded up).
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        ner_model: str | None = "auto",
        hash_key: bytes | None = None,
        cache_entries: int = 100_000,  # ~ a few hundred bytes each: offsets and scores, no text
        split_chars: int = 1500,
        stuck_after_s: float = 30.0,
        max_chars: int = DEFAULT_PII_MAX_CHARS,
        share: int | None = None,
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars is at least 1, not {max_chars}")
        self.engine = PiiEngine(
            workers=workers, ner_model=ner_model, split_chars=split_chars, stuck_after_s=stuck_after_s, share=share
        )
        self.max_chars = max_chars
        self._hash_key = hash_key or os.urandom(32)
        self._cache: OrderedDict[tuple[str, str, bytes], tuple[Hit, ...]] = OrderedDict()
        self._cache_entries = cache_entries
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._clean: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()  # roots with nothing found
        self.hits = 0
        self.misses = 0

    @property
    def mode(self) -> str:
        return self.engine.mode

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def __aenter__(self) -> PiiGate:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def inspect_request(
        self, tenant: str, policy: TenantPiiPolicy, request: GenerateRequest, *, rank: int = 0
    ) -> tuple[PiiDecision, GenerateRequest]:
        """`inspect` over all a request carries to an engine: its body and its extra fields.
        Returns the decision and `decision.redacted(request)`. `rank`: its class's (0 first), its
        place among the tenant's jobs waiting for the analyzer pool."""
        decision = await self.inspect_body(tenant, policy, request.body, request.extra, rank=rank, kept=request.kept)
        return decision, decision.redacted(request)

    async def inspect(
        self, tenant: str, policy: TenantPiiPolicy, messages: list[Message], stop: Sequence[str] = ()
    ) -> PiiDecision:
        """Messages (and stop sequences) alone, as a chat carries them."""
        return await self.inspect_body(
            tenant, policy, ChatBody(model="-", messages=list(messages), stop=list(stop) or None)
        )

    async def inspect_body(
        self, tenant: str, policy: TenantPiiPolicy, body: Body, extra: bytes = b"", *, rank: int = 0, kept: bytes = b""
    ) -> PiiDecision:
        """Raises `PiiUnavailable` when analysis fails and the policy fails closed, `PiiTooLarge`
        (before any analysis) when the texts are over `max_chars`; a blocked request is a decision
        (audit it, then `raise_if_blocked()`)."""
        key = fingerprint(policy)
        plan = self._plan(key, policy) if policy.enabled else None
        if plan is None or plan.empty:  # nothing to look for: nothing to refuse either
            return PiiDecision("pass", body, [], tenant, key, self.mode, extra=extra, kept=kept)
        members: dict[str, tuple[dict[str, msgspec.Raw], dict[str, Any]]] = {}
        for name, value in (("extra", extra), ("kept", kept)):
            try:
                raw = dict(codec.extra_members(value))
                members[name] = raw, {k: _decode_value(v) for k, v in raw.items()}
            except codec.DecodeError:  # the gate refuses it before; a record keeps none of it
                return PiiDecision(
                    "blocked",
                    body,
                    [],
                    tenant,
                    key,
                    self.mode,
                    extra=b"",
                    refusal=PiiRefused(f"{name} is not a JSON object", name),
                )
        found = collect(
            body, members["extra"][1], lambda digest: (tenant, key, digest) in self._clean, members["kept"][1]
        )
        _check_size(found, self.max_chars)
        hits, analyzed, unavailable, cpu_ms = await self._analyze(tenant, key, plan, policy, found.texts, rank)
        findings, edits = self._findings(tenant, policy, found, hits)
        if unavailable is None:
            self._remember_clean(tenant, key, found, {slot for slot, _ in edits})
        body, extra, kept, refusal = _written(body, extra, kept, members, found, edits)
        actions = {f.action for f in findings}
        verdict: Verdict = "blocked" if Action.block in actions or refusal else "redacted" if actions else "pass"
        return PiiDecision(
            verdict,
            body,
            findings,
            tenant,
            key,
            self.mode,
            analyzed,
            len(found.texts) - analyzed,
            unavailable,
            sorted({f.entity_type for f in findings}),
            cpu_ms,
            extra,
            refusal,
            kept,
        )

    async def _analyze(
        self, tenant: str, key: str, plan: Plan, policy: TenantPiiPolicy, texts: list[str], rank: int
    ) -> tuple[list[tuple[Hit, ...] | None], int, str | None, float]:
        """Findings per text (None: unavailable, the policy failing open), the texts sent to the
        pool, why analysis was unavailable, and the pool's CPU milliseconds."""
        # Each distinct text once: a schema repeats "type" and "string" dozens of times.
        distinct = list(dict.fromkeys(texts))
        found: dict[str, tuple[Hit, ...] | None] = dict.fromkeys(distinct)
        todo: list[tuple[str, bytes]] = []
        for text in distinct:
            digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
            if not text:
                found[text] = ()
            elif (cached := self._cache.get((tenant, key, digest))) is not None:
                self._cache.move_to_end((tenant, key, digest))
                found[text] = cached
            else:
                todo.append((text, digest))
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        unavailable = None
        cpu_ms = 0.0
        if todo:
            try:
                results, cpu_ms = await self.engine.analyze(
                    tenant, plan, [t for t, _ in todo], policy.timeout_ms / 1000, rank=rank
                )
            except PiiUnavailable as exc:
                if not policy.fail_open:
                    raise
                unavailable = exc.reason
            else:
                for (text, digest), h in zip(todo, results, strict=True):
                    found[text] = self._remember((tenant, key, digest), tuple(h))
        return [found[t] for t in texts], len(todo), unavailable, cpu_ms

    def stream_redactor(self, tenant: str, policy: TenantPiiPolicy, **kw: int) -> StreamRedactor:
        """A redactor for this tenant's streamed output, with the same pseudonyms as the gate."""
        return StreamRedactor.for_policy(policy, Replacer(self._hash_key, tenant), **kw)

    def _plan(self, key: str, policy: TenantPiiPolicy) -> Plan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_for(policy, key)
            if len(self._plans) > 1024:
                self._plans.popitem(last=False)
        return plan

    def _remember_clean(self, tenant: str, key: str, found: Found, edited: set[Slot]) -> None:
        """Free-form roots with nothing to redact are skipped whole next time (the same bytes)."""
        for digest, start, end in found.roots:
            if not any(slot in edited for slot in found.slots[start:end]):
                self._clean[(tenant, key, digest)] = None
                if len(self._clean) > self._cache_entries // 10:
                    self._clean.popitem(last=False)

    def _remember(self, k: tuple[str, str, bytes], hits: tuple[Hit, ...]) -> tuple[Hit, ...]:
        self._cache[k] = hits
        if len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)
        return hits

    def _findings(
        self, tenant: str, policy: TenantPiiPolicy, found: Found, hits: list[tuple[Hit, ...] | None]
    ) -> tuple[list[Finding], list[tuple[Slot, Any]]]:
        """What the policy acts on, and each slot's text as it may go on (where it changed)."""
        findings: list[Finding] = []
        edits: list[tuple[Slot, Any]] = []
        replace = Replacer(self._hash_key, tenant)
        for slot, text, found_here in zip(found.slots, found.texts, hits, strict=True):
            spans = []
            for etype, start, end, score in found_here or ():
                action = policy.action_for(etype)
                if action is Action.allow:
                    continue
                findings.append(Finding(etype, slot.first_index, start, end, score, action, slot.part, slot.param))
                spans.append((start, end, etype, action))
            if spans:
                edits.append((slot, apply(text, spans, replace.name if slot.name else replace)))
        return findings, edits


def _check_size(found: Found, limit: int) -> None:
    """Raise `PiiTooLarge` when the texts `found` holds add up to more than `limit` characters."""
    chars = sum(map(len, found.texts))
    if chars <= limit:
        return
    per_part: dict[str, int] = {}
    for slot, text in zip(found.slots, found.texts, strict=True):
        per_part[slot.part] = per_part.get(slot.part, 0) + len(text)
    raise PiiTooLarge(chars, limit, max(per_part, key=per_part.__getitem__))


def _written(
    body: Body,
    extra: bytes,
    kept: bytes,
    members: dict[str, tuple[dict[str, msgspec.Raw], dict[str, Any]]],
    found: Found,
    edits: list[tuple[Slot, Any]],
) -> tuple[Body, bytes, bytes, PiiRefused | None]:
    """The body, extra and kept fields with the edits written back, and why the request is
    refused whatever the policy's actions: what cannot be analysed (left out of the copy too),
    or two keys that the edits made one."""
    edits = edits + [(slot, instead) for slot, _, instead in found.unreadable]
    clashes: list[Slot] = []
    body_edits, extra_edits, kept_edits = split(edits)
    if body_edits:
        body = edited(body, body_edits, clashes)
    if extra_edits:
        extra = edited_extra(*members["extra"], extra_edits, clashes)
    if kept_edits:
        kept = edited_extra(*members["kept"], kept_edits, clashes)
    refusal = None
    if found.unreadable:
        slot, what, _ = found.unreadable[0]
        refusal = PiiRefused(
            f"{what} cannot be analysed for PII, and this tenant's policy asks for PII handling; send it as text",
            slot.param,
        )
    elif clashes:
        param = clashes[0].param
        refusal = PiiRefused(f"two keys of {param} read the same once redacted", param)
    return body, extra, kept, refusal
