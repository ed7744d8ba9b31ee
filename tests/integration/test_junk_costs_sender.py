"""Junk costs its sender, not the other tenants (issue 34). Under the NATS accounts `laneway up`
generates, a tenant's user may publish requests only in the classes its document lists: the
server refuses another class and a made-up class token alike. A flood of undecodable messages
from it is read at a bounded rate (its sender's own backlog holds the rest), counted and
terminated without the intake waiting on the DLQ, leaves a bounded
dead-letter stream (LW_DLQ's caps, applied to an old install's stream too) and a bounded log, and
another tenant is served meanwhile. The DLQ writer's queue drops what does not fit (counted) and
writes what it holds when the broker stops."""

from __future__ import annotations

import asyncio
import logging
import time

import nats
import nats.errors
import pytest
from nats.js.api import StreamConfig

from bridge.client import LanewayClient, LanewayError
from broker import intake
from broker.deadletter import LOG_EVERY_S, DeadLetters
from broker.gate.pipeline import Gate
from broker.intake import PullIntake
from broker.metrics import BrokerMetrics
from core.natsd import SHARED_DISK_FILE_STORE, NatsServer
from core.policy.tenants import Tenant, TenantDirectory, hash_key
from core.settings import LogicalModel, Settings
from core.topology import StreamLimits, dead_letter_stream, ensure_intake, ensure_topology
from laneway.nats_config import up_auth
from loadtest.stack import Stack
from schemas.subjects import Subjects
from tests.integration.test_nats_isolation import ViolationLog
from tests.requests import chat
from tests.wait import eventually

pytestmark = pytest.mark.timeout(240)

S = Subjects("lw")
ACME = Tenant(name="acme", api_key_sha256=[hash_key("sk-acme")], classes=["interactive", "batch"])
GLOBEX = Tenant(name="globex", api_key_sha256=[hash_key("sk-globex")])
# LW_DLQ's caps, small: a flood of JUNK would pass each of them many times over.
LIMITS = StreamLimits(dlq_max_msgs_per_subject=100, dlq_max_msgs=1000, dlq_max_bytes=1024**2)
JUNK = 3000


class Junk:
    def __init__(self, server: NatsServer, stack: Stack, auth) -> None:
        self.server, self.stack, self.auth = server, stack, auth
        self.log = ViolationLog(server.log_file)

    async def tenant(self, name: str, errors: list[str] | None = None) -> nats.aio.client.Client:
        async def on_error(exc: Exception) -> None:
            if errors is not None:
                errors.append(str(exc))

        user, password = self.auth.tenants[name]
        return await nats.connect(self.server.url, user=user, password=password, error_cb=on_error)

    async def ops(self) -> nats.aio.client.Client:
        user, password = self.auth.services["ops"]
        return await nats.connect(self.server.url, user=user, password=password, inbox_prefix="_INBOX_ops")

    def counted(self, name: str, reason: str = "malformed") -> float:
        return self.stack.broker.metrics.registry.get_sample_value(name, {"reason": reason}) or 0.0


@pytest.fixture(scope="module")
async def junk(tmp_path_factory):
    root = tmp_path_factory.mktemp("junk")
    auth = up_auth(S, [ACME, GLOBEX], root)  # the documents: acme's user gets its two classes
    config = root / "nats.conf"
    config.write_text(f'include "{auth.authorization_file.name}"\n')
    server = NatsServer(root / "store", config_file=config, max_file_store=SHARED_DISK_FILE_STORE)
    await server.start()
    settings = Settings(tenants={"acme": ACME, "globex": GLOBEX}, models={"laneway-sim": LogicalModel(pool="sim")})
    try:
        async with Stack(server.url, settings, limits=LIMITS, credentials=dict(auth.services)) as stack:
            yield Junk(server, stack, auth)
    finally:
        await server.stop()


async def test_a_tenant_publishes_requests_only_in_the_classes_it_may_use(junk):
    errors: list[str] = []
    acme = await junk.tenant("acme", errors)
    try:
        async with LanewayClient(acme, "acme") as client:
            served = [t async for t in client.generate(chat("nightly", max_tokens=2), klass="batch")]
            assert len("".join(served).split()) == 2
            # A class the tenant may not use and a class nobody made up: the server refuses both,
            # nothing is stored, and the client says why.
            for klass in ("standard", "j7"):
                with pytest.raises(LanewayError) as err:
                    await client.generate(chat("jump the queue", max_tokens=2), klass=klass).__anext__()
                assert err.value.code == "permission_denied", err.value
                assert f'publish to "lw.req.{klass}.acme"' in err.value.message.lower(), err.value
    finally:
        await acme.close()
    refused: list[str] = []

    def logged() -> bool:
        refused.extend(junk.log.new())
        return all(any(f"lw.req.{k}.acme" in line for line in refused) for k in ("standard", "j7"))

    assert await eventually(logged, timeout=30), refused
    assert all('user:tenant-acme"' in line for line in refused), refused


async def test_a_flood_of_junk_costs_its_sender_not_another_tenant(junk, caplog):
    caplog.set_level(logging.WARNING, logger="laneway.dlq")
    lines_before = len(caplog.records)
    counted, dropped = junk.counted("laneway_dead_lettered_total"), junk.counted("laneway_dead_letters_dropped_total")
    ops = await junk.ops()
    js = ops.jetstream()
    written_before = (await js.stream_info(S.dlq_stream)).state.last_seq
    acme, globex = await junk.tenant("acme"), await junk.tenant("globex")
    try:
        began = time.monotonic()
        for i in range(JUNK):  # undecodable, in both of its classes
            await acme.publish(S.req(ACME.classes[i % 2], "acme"), b"\x93junk %d" % i)
        await acme.flush()
        # Another tenant's request, published behind the flood, is answered.
        async with LanewayClient(globex, "globex") as client:
            text = "".join([t async for t in client.generate(chat("still there?", max_tokens=3), timeout_s=120)])
        assert len(text.split()) == 3

        # Every junk message counted and terminated in the end (read at JUNK_RATE after a burst).
        assert await eventually(lambda: junk.counted("laneway_dead_lettered_total") - counted == JUNK, timeout=120)
        elapsed = time.monotonic() - began

        async def settled() -> bool:
            info = await js.stream_info(S.dlq_stream)
            written = info.state.last_seq - written_before
            return written + junk.counted("laneway_dead_letters_dropped_total") - dropped == JUNK

        assert await eventually(settled, timeout=120), "every dead letter written or counted as dropped"
        assert (await js.stream_info(S.req_stream)).state.messages == 0
        # The dead-letter stream stays within its caps, acme's records within its own subjects'.
        info = await js.stream_info(S.dlq_stream, subjects_filter="lw.dlq.*.acme")
        assert info.state.messages <= LIMITS.dlq_max_msgs and info.state.bytes <= LIMITS.dlq_max_bytes
        assert sum(info.state.subjects.values()) <= len(ACME.classes) * LIMITS.dlq_max_msgs_per_subject
        # The log: one warning per interval, not one per message.
        lines = [r for r in caplog.records[lines_before:] if "dead-lettered" in r.getMessage()]
        print(
            f"\n{JUNK} junk messages in {elapsed:.1f} s: {info.state.messages} records kept "
            f"({info.state.bytes} bytes), {junk.counted('laneway_dead_letters_dropped_total') - dropped:.0f} "
            f"dropped unwritten, {len(lines)} log lines"
        )
        assert 1 <= len(lines) <= 2 + elapsed / LOG_EVERY_S, len(lines)
    finally:
        await acme.close()
        await globex.close()
        await ops.close()


# -- the pieces on a server of their own --------------------------------------------------------
async def test_the_servers_log_of_refused_publishes_stays_within_its_bounds(tmp_path):
    """nats-server logs each publish a permission refuses: a flood of them rolls the log over
    its size limit and old logs beyond the count are deleted, whatever the flood's length."""
    config = tmp_path / "auth.conf"
    config.write_text('authorization { users = [{user: "t", password: "p", permissions: {publish: "ok"}}] }\n')
    server = NatsServer(tmp_path / "store", config_file=config, log_size_limit=20_000, log_max_files=2)
    await server.start()
    nc = await nats.connect(server.url, user="t", password="p", error_cb=_ignore)
    try:
        for i in range(3000):  # ~170 bytes of log each: 25 times the whole bound
            await nc.publish(f"refused.{i}", b"x")
        await nc.publish("refused.last", b"x")
        await nc.flush()
        assert await eventually(lambda: "refused.last" in current_log(server))
        logs = list(server.log_file.parent.glob(f"{server.log_file.name}*"))
        assert 1 < len(logs) <= 1 + 2, logs  # rolled, and no more old ones kept than 2
        assert sum(p.stat().st_size for p in logs) <= 3 * 20_000 + 1_000
    finally:
        await nc.close()
        await server.stop()


async def _ignore(exc: Exception) -> None:
    pass


def current_log(server: NatsServer) -> str:
    """The log being written; empty while nats-server rolls it over (the file renamed, the next
    one not yet created: the last clean clone read in that moment)."""
    try:
        return server.log_file.read_text()
    except FileNotFoundError:
        return ""


async def test_junk_is_read_at_a_bounded_rate_and_the_rest_waits_in_its_senders_backlog(nats_server, monkeypatch):
    """Each junk message spends a token; with none left the intake issues no pull (here the
    tokens never come back), so what it reads is the burst and at most the pull in flight."""
    monkeypatch.setattr(intake, "JUNK_BURST", 20)
    monkeypatch.setattr(intake, "JUNK_RATE", 1e-9)
    s, batch, sent = Subjects("junkrate"), 8, 200
    nc = await nats.connect(nats_server.url)
    read: list[bytes] = []

    async def unreadable(msg) -> bool:
        read.append(msg.data)
        await msg.term()
        return False

    pulls = PullIntake(
        nc, s.req_stream, s.intake_durable("interactive", "acme"), unreadable, room=lambda: 1000, batch=batch
    )
    try:
        js = nc.jetstream()
        await ensure_topology(js, s, LIMITS)
        await ensure_intake(js, s, LIMITS, tenants=["acme"])
        for i in range(sent):
            await js.publish(s.req("interactive", "acme"), b"\x93junk %d" % i)
        await pulls.start()

        async def holding() -> bool:
            info = await js.consumer_info(s.req_stream, s.intake_durable("interactive", "acme"))
            return len(read) >= 20 and info.num_waiting == 0 and info.num_ack_pending == 0

        assert await eventually(holding), len(read)
        assert len(read) < 20 + batch  # no pull after the tokens ran out
        assert (await js.stream_info(s.req_stream)).state.messages == sent - len(read)
    finally:
        await pulls.stop()
        await nc.close()


async def test_provisioning_caps_an_old_installs_dead_letter_stream(nats_server):
    s = Subjects("olddlq")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        uncapped = StreamConfig(name=s.dlq_stream, subjects=[s.dlq_all], max_age=LIMITS.dlq_max_age_s)
        await js.add_stream(uncapped)  # as provisioning made it before the caps
        for i in range(150):
            await js.publish(s.dlq("interactive", "acme"), b"old record %d" % i)
        await ensure_topology(js, s, LIMITS)
        info = await js.stream_info(s.dlq_stream)
        wanted = dead_letter_stream(s, LIMITS)
        assert (info.config.max_msgs_per_subject, info.config.max_msgs, info.config.max_bytes, info.config.discard) == (
            wanted.max_msgs_per_subject,
            wanted.max_msgs,
            wanted.max_bytes,
            wanted.discard,
        )
        assert info.state.messages == LIMITS.dlq_max_msgs_per_subject, "the oldest over the cap are gone"
    finally:
        await nc.close()


async def test_the_dead_letter_queue_drops_what_does_not_fit_and_writes_the_rest_at_stop(nats_server):
    s = Subjects("dq")
    nc = await nats.connect(nats_server.url)
    metrics = BrokerMetrics()
    dead = DeadLetters(nc, s, metrics, 3, on_removed=_unused, gate=Gate(s), tenants=TenantDirectory(), queue_size=2)
    try:
        js = nc.jetstream()
        await ensure_topology(js, s, LIMITS)
        await ensure_intake(js, s, LIMITS, tenants=["acme"])
        for i in range(5):
            await js.publish(s.req("interactive", "acme"), b"\x93junk %d" % i)
        pull = await js.pull_subscribe_bind(s.intake_durable("interactive", "acme"), s.req_stream)
        for msg in await pull.fetch(5, timeout=10):
            await dead.unreadable(msg, "malformed", "not a request")
        assert metrics.registry.get_sample_value("laneway_dead_lettered_total", {"reason": "malformed"}) == 5
        assert metrics.registry.get_sample_value("laneway_dead_letters_dropped_total", {"reason": "malformed"}) == 3
        # Terminated at once, the dropped ones too: nothing waits in the queue against the sender.
        assert await eventually(lambda: _stored(js, s.req_stream, 0))
        assert await _stored(js, s.dlq_stream, 0), "no record before the writer runs"
        # The writer is stopped as it starts: what it was writing and what it holds are written
        # on the way out (the one in flight perhaps twice), and the cancellation goes on.
        writer = asyncio.create_task(dead.run())
        await asyncio.sleep(0)  # started: a task cancelled before its first step never runs
        writer.cancel()
        await asyncio.wait([writer])
        assert writer.cancelled()
        records = await js.pull_subscribe(s.dlq_all, stream=s.dlq_stream)
        kept = {m.data for m in await records.fetch(3, timeout=2)}
        assert kept == {b"\x93junk 0", b"\x93junk 1"}
    finally:
        await nc.close()


async def _stored(js, stream: str, count: int) -> bool:
    return (await js.stream_info(stream)).state.messages == count


async def _unused(tenant: str, request_id: str) -> None:
    raise AssertionError("only the max-deliveries path gives anything back")
