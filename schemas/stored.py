"""A stored response as the `lw_responses` bucket holds it (key `<tenant>.<id>`, msgpack).

The JSON members are kept as the bytes the edge answers with, so a GET serves them without
re-encoding. What is stored of the request is only what came back from the engine's side
(`Finished.messages`, `Finished.fields`): the input, and every text the Response repeats of the
request, as the tenant's PII policy let them through.
Fields are append-only, with defaults (msgspec's schema evolution).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

# A streamed background response resumes from its last events up to this size: the record, with
# its Response, must stay well under NATS's payload limit (1 MiB by default).
MAX_STORED_EVENT_BYTES = 256 * 1024
STALE_LEASES = 4  # a background record not refreshed for this many leases lost its bridge


class Rerun(msgspec.Struct, omit_defaults=True, gc=False):
    """What another bridge needs to run a background response again when its own is gone: the
    request as it was accepted, raw (as the request stream holds it until the generation ends).
    It lives in `lw_background`, which only bridges may read, while the response runs; never in
    the stored record, which `ops` may read and which holds only what the PII stage let through."""

    request: bytes  # the GenerateRequest as published (msgpack)
    body: bytes  # the Responses body as the client sent it (JSON)
    history_len: int = 0  # of the engine's messages, how many a previous response or conversation gave
    conversation: str = ""  # the conversation the response continues, if any


class StoredResponse(msgspec.Struct, omit_defaults=True, gc=False):
    response: bytes  # the Response object (JSON), as GET answers it
    request_id: str  # Laneway's request id (a cancel names it)
    input_items: bytes = b"[]"  # this request's input, as items (JSON list), redacted
    history: bytes = b"[]"  # the chat messages through this response's output (JSON): a
    # later `previous_response_id` continues from them
    owner: str = ""  # background: the edge running it ...
    beat_at: float = 0.0  # ... when it last said so (unix seconds) ...
    lease_s: float = 0.0  # ... and how often it says so
    events: list[bytes] = []  # background + stream: the SSE events so far, by sequence_number
    first_event: int = 0  # the sequence_number of events[0] (the oldest are dropped past the bound)
    rerunnable: bool = False  # background, while running: its request is kept for another bridge


class StoredConversation(msgspec.Struct, omit_defaults=True, gc=False):
    """A conversation (`/v1/conversations`) in the same bucket, under `<tenant>.conv_<id>`."""

    conversation: bytes  # the Conversation object (JSON): id, created_at, metadata
    items: bytes = b"[]"  # its items in order (JSON list), each with its id
    next_item: int = 0  # the number the next item's id takes


Record = StoredResponse | StoredConversation
RESPONSE_PREFIX, CONVERSATION_PREFIX = "resp_", "conv_"  # an id says which kind its record is

_encode = msgspec.msgpack.Encoder().encode
_decoders: dict[type[Record], Callable[[bytes], Record]] = {
    StoredResponse: msgspec.msgpack.Decoder(StoredResponse).decode,
    StoredConversation: msgspec.msgpack.Decoder(StoredConversation).decode,
}


encode_rerun = _encode
decode_rerun = msgspec.msgpack.Decoder(Rerun).decode


def encode(record: Record) -> bytes:
    return _encode(record)


def decode(data: bytes, kind: type[Record] = StoredResponse) -> Record:
    return _decoders[kind](data)
