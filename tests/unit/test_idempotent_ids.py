"""An Idempotency-Key's request id is an HMAC under the bridges' shared secret: the same on every
replica that shares it, unknown to anyone without it, and never derived from a built-in constant
(`laneway bridge` will not start without the secret)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from bridge.auth import idempotent_id
from bridge.config import BridgeConfig

SECRET = "s" * 64


def test_the_id_depends_on_the_secret_the_tenant_and_the_key():
    one = idempotent_id(SECRET, "acme", "k1")
    assert one == idempotent_id(SECRET, "acme", "k1")  # another replica, the same id
    assert len(one) == 32 and set(one) <= set("0123456789abcdef")
    assert one != idempotent_id(SECRET, "globex", "k1")
    assert one != idempotent_id(SECRET, "acme", "k2")
    assert one != idempotent_id("t" * 64, "acme", "k1")
    assert one != hashlib.sha256(b"acme\0k1").hexdigest()[:32]


def test_in_process_bridges_get_a_random_secret_and_a_short_one_is_refused():
    assert BridgeConfig().idempotency_secret != BridgeConfig().idempotency_secret
    assert SECRET not in repr(BridgeConfig(idempotency_secret=SECRET))
    with pytest.raises(ValueError, match="idempotency secret"):
        BridgeConfig(idempotency_secret="short")


@pytest.mark.parametrize("secret", [None, "too-short"])
def test_laneway_bridge_does_not_start_without_a_secret(secret):
    env = {k: v for k, v in os.environ.items() if k != "LANEWAY_IDEMPOTENCY_SECRET"}
    if secret is not None:
        env["LANEWAY_IDEMPOTENCY_SECRET"] = secret
    done = subprocess.run(
        [sys.executable, "-m", "laneway.cli", "bridge", "--nats-url", "nats://127.0.0.1:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "LANEWAY_IDEMPOTENCY_SECRET" in done.stderr
