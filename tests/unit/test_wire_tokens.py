"""The wire's token fields refuse a trailing newline. Python's `$` matches before a final
newline, and msgspec searches a `pattern` with `re`, so `^...$` let `"acme\\n"` through: a token
that, put in a NATS subject, splits the protocol line it is sent on."""

from __future__ import annotations

import msgspec
import pytest

from core.policy.tenants import Tenant
from schemas import codec
from schemas.requests import GenerateRequest
from tests.requests import chat


def request(**fields) -> bytes:
    base = dict(
        request_id="r1",
        tenant="acme",
        klass="interactive",
        model="laneway-sim",
        reply_to="lw.tok.acme.e1",
        created_at=0.0,
        deadline=1.0,
        chat=chat("hi"),
    )
    return codec.encode(GenerateRequest(**{**base, **fields}))


@pytest.mark.parametrize("field", ["request_id", "tenant", "klass", "edge"])
def test_a_token_with_a_trailing_newline_is_refused(field):
    assert codec.decode_request(request(**{field: "acme"})).tenant == "acme"
    with pytest.raises(msgspec.ValidationError):
        codec.decode_request(request(**{field: "acme\n"}))


def test_a_key_hash_with_a_trailing_newline_is_refused():
    digest = "a" * 64
    assert msgspec.convert({"name": "acme", "api_key_sha256": [digest]}, Tenant).api_key_sha256 == [digest]
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"name": "acme", "api_key_sha256": [digest + "\n"]}, Tenant)
