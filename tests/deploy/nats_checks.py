"""What the deploy tests check of a rendered NATS config: its accounts, read as nats-server reads
them, and, live, that a tenant's user is fenced into its own account."""

from __future__ import annotations

import json

import nats

from schemas.subjects import Subjects, service_inbox
from tests.wait import eventually

S = Subjects("lw")
# Subjects a tenant must never publish to (the control plane, JetStream's API, broker events).
FORBIDDEN = (
    "$KV.lw_tenants.{other}",
    "$KV.lw_routing.rules",
    "$KV.lw_quota_use.{tenant}.tokens",
    "$JS.API.INFO",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.DELETE.LW_REQ",
    "lw.evt.broker.forged",
    "lw.usage.{tenant}",
    "lw.req.interactive.{other}",
    "lw.req.no-such-class.{tenant}",
)  # its requests only in the classes it may use


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard semantics: `*` one token, `>` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def parse_accounts(text: str) -> dict:
    """An `accounts {...}` file as laneway/nats_config.py and the chart write it (JSON body)."""
    head, _, body = text.partition(" ")
    assert head == "accounts", text[:40]
    return json.loads(body)


def user_accounts(accounts: dict) -> dict[str, tuple[str, dict]]:
    """user → (its account's name, that user's entry)."""
    return {u["user"]: (name, u) for name, account in accounts.items() for u in account.get("users", [])}


async def check_tenant_is_fenced(urls: list[str], tenant: str, password: str, ops: tuple[str, str]) -> None:
    """As `tenant-<tenant>`: its own protocol works through the service import (a request is
    stored and its PubAck comes back); a PubAck aimed at the tenants bucket writes nothing; every
    control-plane subject is refused with a permissions error."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        urls,
        user=f"tenant-{tenant}",
        password=password,
        error_cb=on_error,
        allow_reconnect=False,
        max_reconnect_attempts=0,
    )
    admin = await nats.connect(urls, user=ops[0], password=ops[1], inbox_prefix=service_inbox(ops[0]))
    try:
        tenants = await admin.jetstream().key_value("lw_tenants")
        before = (await tenants.get(tenant)).revision
        await nc.publish(S.req("interactive", tenant), b"{}", reply=f"$KV.lw_tenants.{tenant}")
        # JetStream answers in order: once this PubAck is back, the one above has been sent.
        ack = json.loads((await nc.request(S.req("interactive", tenant), b"{}", timeout=10)).data)
        assert ack.get("stream") == S.req_stream, ack
        assert (await tenants.get(tenant)).revision == before, "a PubAck rewrote the tenant's document"
        forbidden = [f.format(tenant=tenant, other=f"not-{tenant}") for f in FORBIDDEN]
        for subject in forbidden:
            await nc.publish(subject, b"{}")
        await nc.flush()

        def all_refused() -> bool:
            return all(any(f'publish to "{subject}"'.lower() in e.lower() for e in errors) for subject in forbidden)

        assert await eventually(all_refused, timeout=10), f"not refused: {forbidden} vs {errors}"
    finally:
        await nc.close()
        await admin.close()
