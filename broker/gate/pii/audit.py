"""The PII audit record published on `lw.audit.<tenant>` (stream `LW_AUDIT`).

It says what was found where and what was done — entity types, counts, offsets, actions — and
never holds a raw value, not even a hash of one.
"""

from __future__ import annotations

import msgspec


class AuditSpan(msgspec.Struct, array_like=True, gc=False):
    message_index: int
    entity_type: str
    start: int
    end: int
    action: str
    part: str = "messages"  # the top-level request field ("messages", "stop", "tools", ...); appended
    param: str = ""  # where in it, as OpenAI names it ("messages[2].name"); appended


class PiiAudit(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    request_id: str
    tenant: str
    action: str  # pass | redacted | blocked
    entity_types: list[str]  # sorted, distinct
    counts: dict[str, int]  # entity type -> findings
    spans: list[AuditSpan]  # offsets in the original texts
    policy: str  # policy fingerprint: which rules decided
    mode: str  # "ner" or "regex": what the analyzer could see
    analyzed_messages: int = 0  # texts analyzed for this request (the name predates other fields)
    cached_messages: int = 0  # texts whose analysis came from the cache
    unavailable: str | None = None  # analysis failed and the policy failed open: why
    at: float = 0.0  # unix seconds


# msgpack on NATS, like every other record (schemas/codec.py).
encode_audit = msgspec.msgpack.Encoder().encode
decode_audit = msgspec.msgpack.Decoder(PiiAudit).decode
