"""Logical models (what clients name in `model`) → pools, stored under `models` in `lw_routing`."""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext

from core.settings import LogicalModel
from schemas.subjects import Subjects

MODELS_KEY = "models"

_decode = msgspec.json.Decoder(dict[str, LogicalModel]).decode
encode_models = msgspec.json.Encoder().encode


def decode_models(document: bytes) -> dict[str, LogicalModel]:
    try:
        return _decode(document)
    except msgspec.DecodeError as exc:
        raise ValueError(f"models document: {exc}") from None


async def put_models(js: JetStreamContext, s: Subjects, models: dict[str, LogicalModel]) -> None:
    kv = await js.key_value(s.bucket("routing"))
    await kv.put(MODELS_KEY, encode_models(models))


def served_names(models: dict[str, LogicalModel], rules) -> set[str]:
    """The model names clients may ask for: the models table's and the routing rules' (if any)."""
    return set(models) | (set(rules.models) if rules is not None else set())
