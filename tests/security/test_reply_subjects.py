"""A tenant's NATS user names a control-plane subject as the reply of its own request.

NATS never checks a publish's reply subject, and JetStream sends its PubAck, from its own
internal client, to whatever reply the publisher named. With every user in one account (before
issue 20), `tenant-acme` publishing to its own `lw.req.interactive.acme` with
`reply="$KV.lw_tenants.globex"` had JetStream overwrite globex's tenant document with
`{"stream":"LW_REQ","seq":N}`; other replies wrote into the routing table, a quota bucket, the
usage, audit and dead-letter streams, another tenant's token inbox, or looked like a broker's
heartbeat. In an account of its own, the tenant reaches the services only through a service
import, whose reply the server rewrites: the PubAck comes back to the tenant's own account.
"""

from __future__ import annotations

import nats
import pytest

from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = pytest.mark.timeout(600)

S = Subjects("lw")
PUBACK = b'"stream":"LW_REQ"'  # what JetStream would have written there
KV_BUCKETS = {"tenants": "ops", "routing": "ops", "classes": "ops", "quota_use": "svc-broker", "cache": "svc-broker"}
REPLIES = [
    "$KV.lw_tenants.globex",
    "$KV.lw_routing.models",
    "$KV.lw_classes.interactive",
    "$KV.lw_quota_use.acme.spent",
    "$KV.lw_cache.forged",
    "lw.evt.broker.spoofed",
    "lw.sched.admit",
    "lw.sched.leader",
    "lw.sched.settled.spoofed",
    "lw.usage.acme",
    "lw.audit.acme",
    "lw.dlq.batch.acme",
    "lw.tok.globex.edge",
]


async def stream_messages(js, stream: str) -> list[bytes]:
    """Every message `stream` holds, read with an ordered consumer."""
    info = await js.stream_info(stream)
    found: list[bytes] = []
    if info.state.messages == 0:
        return found
    sub = await js.subscribe(">", stream=stream, ordered_consumer=True)
    try:
        while len(found) < info.state.messages:
            try:
                found.append((await sub.next_msg(timeout=5)).data)
            except nats.errors.TimeoutError:
                break
    finally:
        await sub.unsubscribe()
    return found


async def test_a_reply_subject_never_writes_into_the_control_plane(up):
    ops = await up.connect_nats("ops")
    broker = await up.connect_nats("svc-broker")
    bridge = await up.connect_nats("svc-bridge")
    acme = await up.connect_nats("tenant-acme", inbox_prefix="_INBOX_acme")  # works on either layout
    try:
        ops_js, broker_js = ops.jetstream(), broker.jetstream()
        clients = {"ops": ops_js, "svc-broker": broker_js}

        async def last_seqs() -> dict[str, int]:
            seqs = {}
            for name, user in KV_BUCKETS.items():
                try:
                    seqs[name] = (await clients[user].stream_info(f"KV_{S.bucket(name)}")).state.last_seq
                except nats.js.errors.NotFoundError:
                    seqs[name] = 0  # created on first use
            return seqs

        before = await last_seqs()
        tenants = await ops_js.key_value(S.bucket("tenants"))
        globex = await tenants.get("globex")

        # What a service would see arrive on its own subjects while the attack runs.
        heard: list[tuple[str, bytes]] = []

        async def hear(msg) -> None:
            heard.append((msg.subject, msg.data))

        for subject in (S.broker_events, "lw.sched.>"):
            await broker.subscribe(subject, cb=hear)
        await bridge.subscribe("lw.tok.*.*", cb=hear)
        await broker.flush()
        await bridge.flush()
        dlq_before = len(await stream_messages(ops_js, S.dlq_stream))

        for i, reply in enumerate(REPLIES):
            await acme.publish(
                S.req("interactive", "acme"), b"attack", reply=reply, headers={"Nats-Msg-Id": f"acme:attack-{i}"}
            )
        # The positive signal that every attack was handled: a later publish's PubAck comes back
        # (JetStream answers in order), and the broker dead-letters each attack's bytes.
        ack = await acme.jetstream().publish(
            S.req("interactive", "acme"), b"attack", headers={"Nats-Msg-Id": "acme:attack-last"}
        )
        assert ack.stream == S.req_stream
        assert await eventually(lambda: _count_at_least(ops_js, dlq_before + len(REPLIES) + 1), timeout=60)
        await broker.flush()
        await bridge.flush()

        assert (await tenants.get("globex")).revision == globex.revision, "globex's document was overwritten"
        after = await last_seqs()
        written = {name: (before[name], after[name]) for name in KV_BUCKETS if after[name] != before[name]}
        assert written == {}, f"buckets written by the attack: {written}"
        assert [h for h in heard if PUBACK in h[1]] == [], "a PubAck reached a service's subject"
        for stream in (S.usage_stream, S.audit_stream, S.dlq_stream):
            assert not [m for m in await stream_messages(ops_js, stream) if PUBACK in m], stream
    finally:
        for nc in (ops, broker, bridge, acme):
            await nc.close()


async def _count_at_least(js, n: int) -> bool:
    return (await js.stream_info(S.dlq_stream)).state.messages >= n
