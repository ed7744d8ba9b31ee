"""Encoders and decoders, each built once (msgspec perf tip): msgpack on NATS, JSON at the edge."""

from __future__ import annotations

import msgspec

from schemas.frames import TokenFrame
from schemas.openai import ChatCompletionRequest
from schemas.requests import Cancel, GenerateRequest
from schemas.usage import Usage
from schemas.work import Batch, Credit, Heartbeat

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

# HTTP edge.
_json = msgspec.json.Encoder()
encode_json = _json.encode
decode_chat_request = msgspec.json.Decoder(ChatCompletionRequest).decode

DecodeError = msgspec.DecodeError
ValidationError = msgspec.ValidationError
