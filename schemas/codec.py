"""Encoders and decoders, each built once (msgspec perf tip): msgpack on NATS, JSON at the edge."""

from __future__ import annotations

import re

import msgspec

from schemas.continuation import Continuation, ContinueAsk
from schemas.frames import TokenFrame
from schemas.openai import (
    KNOWN_CHAT_FIELDS,
    KNOWN_COMPLETION_FIELDS,
    KNOWN_EMBEDDING_FIELDS,
    ChatBody,
    CompletionBody,
    EmbeddingBody,
)
from schemas.requests import Cancel, GenerateRequest
from schemas.resume import Relayed, ResumeControl
from schemas.usage import Superseded, Usage
from schemas.work import AdmitAnswer, Admitted, Batch, BrokerBeat, Credit, Fence, Heartbeat, Settled

# NATS payloads: one msgpack encoder for every struct, one typed decoder per message kind.
_mp = msgspec.msgpack.Encoder()
encode = _mp.encode

decode_request = msgspec.msgpack.Decoder(GenerateRequest).decode
decode_frame = msgspec.msgpack.Decoder(TokenFrame).decode
decode_credit = msgspec.msgpack.Decoder(Credit).decode
decode_batch = msgspec.msgpack.Decoder(Batch).decode
decode_cancel = msgspec.msgpack.Decoder(Cancel).decode
decode_heartbeat = msgspec.msgpack.Decoder(Heartbeat).decode
decode_usage = msgspec.msgpack.Decoder(Usage).decode
decode_superseded = msgspec.msgpack.Decoder(Superseded).decode
decode_admitted = msgspec.msgpack.Decoder(Admitted).decode
decode_admit_answer = msgspec.msgpack.Decoder(AdmitAnswer).decode
decode_settled = msgspec.msgpack.Decoder(Settled).decode
_decode_broker_beat = msgspec.msgpack.Decoder(BrokerBeat).decode
decode_resume_control = msgspec.msgpack.Decoder(ResumeControl).decode
decode_relayed = msgspec.msgpack.Decoder(Relayed).decode
decode_continue_ask = msgspec.msgpack.Decoder(ContinueAsk).decode
decode_continuation = msgspec.msgpack.Decoder(Continuation).decode
decode_fence = msgspec.msgpack.Decoder(Fence).decode


def broker_beat(data: bytes) -> BrokerBeat:
    """A broker's heartbeat; an empty or unreadable one says only that it is alive."""
    try:
        return _decode_broker_beat(data) if data else BrokerBeat()
    except DecodeError:
        return BrokerBeat()


# HTTP edge.
_json = msgspec.json.Encoder()
encode_json = _json.encode
_decode_chat = msgspec.json.Decoder(ChatBody).decode
_decode_completion = msgspec.json.Decoder(CompletionBody).decode
_decode_embedding = msgspec.json.Decoder(EmbeddingBody).decode
# The top level only: each value stays its raw JSON bytes (msgspec skips over it, building nothing).
_decode_members = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode

# The deepest JSON nesting the edge decodes. msgspec recurses once per level, so a body nested
# thousands deep raises RecursionError; a chat request nests about 5 levels, a tool's schema a few more.
MAX_JSON_DEPTH = 64

_STRINGS = re.compile(rb'"[^"]*"')  # once escaped backslashes and quotes are gone
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_OPEN = ord("[")


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON body nests deeper than {limit} levels")
        self.limit = limit


def nests_deeper_than(body: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than `limit`. A body with few brackets (every
    ordinary request) is answered by counting; others are scanned once, stopping past the limit."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    depth = 0
    for char in _STRINGS.sub(b"", unescaped).translate(_BRACKETS, _NOT_BRACKETS):
        if char == _OPEN:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


# vLLM request fields Laneway sets itself: the class decides priority, the tenant scope the
# prefix-cache salt (so one tenant cannot time another's cached prefixes), the edge the id.
LANEWAY_OWNED = frozenset({"priority", "cache_salt", "request_id"})


def other_members(body: bytes, known: frozenset[str]) -> bytes:
    """The body's top-level members Laneway does not type, re-joined verbatim as a JSON object
    (b"" when there are none): `GenerateRequest.extra`. An explicit null means "not set" in the
    OpenAI API, and the fields Laneway sets are not the client's: both are left out."""
    members = _decode_members(body)
    if members.keys() <= known:
        return b""
    other = {
        k: v for k, v in members.items() if k not in known and k not in LANEWAY_OWNED and bytes(v).strip() != b"null"
    }
    return encode_json(other) if other else b""


def decode_chat_request(body: bytes) -> tuple[ChatBody, bytes]:
    """The typed body and its other members. Raises TooDeep before decoding, msgspec's
    DecodeError or ValidationError while decoding."""
    if nests_deeper_than(body, MAX_JSON_DEPTH):
        raise TooDeep(MAX_JSON_DEPTH)
    return _decode_chat(body), other_members(body, KNOWN_CHAT_FIELDS)


def decode_completion_request(body: bytes) -> tuple[CompletionBody, bytes]:
    if nests_deeper_than(body, MAX_JSON_DEPTH):
        raise TooDeep(MAX_JSON_DEPTH)
    return _decode_completion(body), other_members(body, KNOWN_COMPLETION_FIELDS)


def decode_embedding_request(body: bytes) -> tuple[EmbeddingBody, bytes]:
    if nests_deeper_than(body, MAX_JSON_DEPTH):
        raise TooDeep(MAX_JSON_DEPTH)
    return _decode_embedding(body), other_members(body, KNOWN_EMBEDDING_FIELDS)


def extra_members(extra: bytes) -> dict[str, msgspec.Raw]:
    """`GenerateRequest.extra` as name → raw JSON value."""
    return _decode_members(extra) if extra else {}


_TYPED = {ChatBody: KNOWN_CHAT_FIELDS, CompletionBody: KNOWN_COMPLETION_FIELDS, EmbeddingBody: KNOWN_EMBEDDING_FIELDS}


def extra_conflict(request: GenerateRequest) -> str | None:
    """The first member of `extra` that names a typed field of the body (it would override what
    the gate checked, redacted and counted) or one Laneway sets; None when there is none.
    Raises DecodeError when `extra` is not a JSON object."""
    if not request.extra:
        return None
    typed = _TYPED[type(request.body)]
    return next((k for k in extra_members(request.extra) if k in typed or k in LANEWAY_OWNED), None)


DecodeError = msgspec.DecodeError
ValidationError = msgspec.ValidationError
