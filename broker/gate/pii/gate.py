"""The PII stage of the broker's gate: analyze the new messages of a chat (their text content,
tool calls' arguments and tool results) or a completion's prompt, and the request's stop
sequences, which reach the engine too; apply the tenant's policy, and say what was done.

Speed comes from not repeating work: a chat resends its whole history every turn, so results are
cached by (tenant, policy version, message hash) and only messages never seen before go to the
pool. The cache holds offsets and scores, never text.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from broker.gate.pii.audit import AuditSpan, PiiAudit
from broker.gate.pii.engine import PiiEngine
from broker.gate.pii.plan import Hit, Plan, plan_for
from broker.gate.pii.redact import Replacer, apply
from broker.gate.pii.slots import texts_of, written_back
from broker.gate.pii.stream_redactor import StreamRedactor
from broker.policy.pii import Action, TenantPiiPolicy, fingerprint
from broker.policy.pii_errors import PiiBlocked, PiiUnavailable
from schemas.openai import EmbeddingBody, Message
from schemas.requests import GenerateRequest

Verdict = Literal["pass", "redacted", "blocked"]
Part = Literal["messages", "stop"]   # the request field a finding is in (OpenAI's `param` names)


@dataclass(frozen=True, slots=True)
class Finding:
    entity_type: str
    message_index: int
    start: int          # offsets in the original text (of the message's slot)
    end: int
    score: float
    action: Action
    part: Part = "messages"    # "stop": `message_index` is the index of a stop sequence
    slot: str = "content"      # in the message: its "content", a text "part", tool call "arguments"


@dataclass(frozen=True, slots=True)
class PiiDecision:
    action: Verdict
    messages: list[Message]          # what may go on: redacted (and, if blocked, fully redacted)
    findings: list[Finding]
    tenant: str
    policy: str                      # policy fingerprint
    mode: str                        # "ner" | "regex"
    analyzed: int = 0                # messages sent to the pool for this request
    cached: int = 0                  # messages answered from the cache
    unavailable: str | None = None   # set when analysis failed and the policy failed open
    entity_types: list[str] = field(default_factory=list)
    cpu_ms: float = 0.0              # pool CPU on the critical path (slowest job); 0 if all cached
    stop: list[str] = field(default_factory=list)   # the stop sequences, redacted like `messages`

    def raise_if_blocked(self) -> None:
        if self.action == "blocked":
            blocked = [f for f in self.findings if f.action is Action.block]
            param = "stop" if all(f.part == "stop" for f in blocked) else "messages"
            raise PiiBlocked([f.entity_type for f in blocked], param)

    def redacted(self, request: GenerateRequest) -> GenerateRequest:
        """`request` as it may go on: its prompt or messages and its stop sequences replaced by
        the redacted ones (a blocked request comes back fully redacted too)."""
        if self.action == "pass":
            return request
        stop = self.stop or None
        if request.chat is not None:
            chat = msgspec.structs.replace(request.chat, messages=self.messages, stop=stop)
            return msgspec.structs.replace(request, chat=chat)
        if request.embedding is not None:
            return msgspec.structs.replace(request, embedding=self._embedding(request.embedding))
        completion = request.body
        prompt, *suffix = [m.content for m in self.messages]
        completion = msgspec.structs.replace(completion, prompt=prompt, stop=stop,
                                             suffix=suffix[0] if suffix else completion.suffix)
        return msgspec.structs.replace(request, completion=completion)

    def _embedding(self, body: EmbeddingBody) -> EmbeddingBody:
        """The text inputs replaced, in order, by the redacted messages (token ids pass as given)."""
        texts = iter(m.content for m in self.messages)
        if isinstance(body.input, str):
            return msgspec.structs.replace(body, input=next(texts))
        return msgspec.structs.replace(body, input=[next(texts) if isinstance(x, str) else x for x in body.input])

    def audit(self, request_id: str, at: float | None = None) -> PiiAudit:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.entity_type] = counts.get(f.entity_type, 0) + 1
        return PiiAudit(
            request_id=request_id, tenant=self.tenant, action=self.action,
            entity_types=self.entity_types, counts=counts,
            spans=[AuditSpan(f.message_index, f.entity_type, f.start, f.end, f.action.value, f.part)
                   for f in self.findings],
            policy=self.policy, mode=self.mode, analyzed_messages=self.analyzed,
            cached_messages=self.cached, unavailable=self.unavailable,
            at=time.time() if at is None else at,
        )


class PiiGate:
    """`async with PiiGate() as gate: decision = await gate.inspect(tenant, policy, messages)`.

    `hash_key` keys the `hash` action's pseudonyms; give every broker replica the same secret so
    a value maps to the same pseudonym whichever replica saw it (a random key is used if absent:
    fine for one process, not for a fleet).
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        ner_model: str | None = "auto",
        hash_key: bytes | None = None,
        cache_entries: int = 100_000,    # ~ a few hundred bytes each: offsets and scores, no text
        split_chars: int = 1500,
        stuck_after_s: float = 30.0,
    ) -> None:
        self.engine = PiiEngine(workers=workers, ner_model=ner_model, split_chars=split_chars,
                                stuck_after_s=stuck_after_s)
        self._hash_key = hash_key or os.urandom(32)
        self._cache: OrderedDict[tuple[str, str, bytes], tuple[Hit, ...]] = OrderedDict()
        self._cache_entries = cache_entries
        self._plans: OrderedDict[str, Plan] = OrderedDict()
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

    async def inspect_request(self, tenant: str, policy: TenantPiiPolicy,
                              request: GenerateRequest) -> tuple[PiiDecision, GenerateRequest]:
        """`inspect` over all a request carries to an engine as text: its messages (or prompt) and
        its stop sequences. Returns the decision and `decision.redacted(request)`."""
        if request.chat is not None:
            messages = request.chat.messages
        else:   # a completion's prompt and suffix, or the texts to embed, as messages of their own
            messages = [Message("user", t) for t in request.body.texts()]
        decision = await self.inspect(tenant, policy, messages, request.body.stops)
        return decision, decision.redacted(request)

    async def inspect(self, tenant: str, policy: TenantPiiPolicy, messages: list[Message],
                      stop: Sequence[str] = ()) -> PiiDecision:
        """Raises `PiiUnavailable` when analysis fails and the policy fails closed; a blocked
        request is a decision (audit it, then `raise_if_blocked()`)."""
        key = fingerprint(policy)
        if not policy.enabled:
            return PiiDecision("pass", messages, [], tenant, key, self.mode, stop=list(stop))
        plan = self._plan(key, policy)
        # Stop sequences are analysed as texts of their own, after the messages' slots.
        message_texts, slots = texts_of(messages)
        texts = message_texts + list(stop)
        hits: list[tuple[Hit, ...] | None] = [None] * len(texts)
        todo: list[int] = []
        digests: list[bytes] = []
        for i, text in enumerate(texts):
            digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
            digests.append(digest)
            if not text or plan.empty:
                hits[i] = ()
            elif (cached := self._cache.get((tenant, key, digest))) is not None:
                self._cache.move_to_end((tenant, key, digest))
                hits[i] = cached
            else:
                todo.append(i)
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        unavailable = None
        cpu_ms = 0.0
        if todo:
            try:
                found, cpu_ms = await self.engine.analyze(plan, [texts[i] for i in todo],
                                                          policy.timeout_ms / 1000)
            except PiiUnavailable as exc:
                if not policy.fail_open:
                    raise
                unavailable = exc.reason
            else:
                for i, h in zip(todo, found):
                    hits[i] = self._remember((tenant, key, digests[i]), tuple(h))
        return self._decide(tenant, key, policy, messages, slots, texts, hits, len(todo), unavailable, cpu_ms)

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

    def _remember(self, k: tuple[str, str, bytes], hits: tuple[Hit, ...]) -> tuple[Hit, ...]:
        self._cache[k] = hits
        if len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)
        return hits

    def _decide(self, tenant: str, key: str, policy: TenantPiiPolicy, messages: list[Message],
                slots: list, texts: list[str], hits: list[tuple[Hit, ...] | None], analyzed: int,
                unavailable: str | None, cpu_ms: float) -> PiiDecision:
        findings: list[Finding] = []
        out: list[str] = []
        replace = Replacer(self._hash_key, tenant)
        n = len(slots)
        for i, (text, found) in enumerate(zip(texts, hits)):
            if i < n:
                part, index, where = "messages", slots[i].message, slots[i].kind
            else:
                part, index, where = "stop", i - n, "content"
            spans = []
            for etype, start, end, score in found or ():
                action = policy.action_for(etype)
                if action is Action.allow:
                    continue
                findings.append(Finding(etype, index, start, end, score, action, part, where))
                spans.append((start, end, etype, action))
            out.append(apply(text, spans, replace) if spans else text)
        redacted = written_back(messages, slots, out[:n])
        actions = {f.action for f in findings}
        verdict: Verdict = "blocked" if Action.block in actions else "redacted" if actions else "pass"
        return PiiDecision(
            verdict, redacted, findings, tenant, key, self.mode, analyzed,
            len(texts) - analyzed, unavailable, sorted({f.entity_type for f in findings}), cpu_ms,
            out[n:],
        )
