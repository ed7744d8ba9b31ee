"""With the PII stage on, a dead letter keeps the request as the gate let it on (redacted, stop
sequences too), never the raw one, on every way into LW_DLQ: the worker's last failed attempt,
JetStream's max-deliveries advisory, and a message the broker refuses as invalid. A body that
cannot be read is withheld. LW_DLQ keeps records for a bounded time."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats
import pytest

from bridge.client import LanewayClient, LanewayError
from broker.gate.pii import TenantPiiPolicy
from core.policy.tenants import Tenant, hash_key
from core.topology import StreamLimits
from loadtest.stack import Stack, demo_settings
from schemas import codec
from schemas.requests import GenerateRequest
from schemas.work import Credit
from tests.integration.test_poison_and_overload import PoisonableEngine
from tests.requests import chat
from tests.wait import eventually
from workers.engines.sim.roofline import PROFILES

KEY = "sk-dlq-pii"
EMAIL, SSN, CARD, PHONE = "maria.garcia@example.com", "536-22-8726", "4111 1111 1111 1111", "(415) 555-0132"
IBAN, IP = "DE89 3704 0044 0532 0130 00", "192.168.1.20"
RAW = (EMAIL, SSN, CARD, PHONE, IBAN, IP)
TEXT = f"Refund {CARD} to {IBAN} for {EMAIL} (ssn {SSN}), who called from {PHONE} at {IP}."
STOP = [EMAIL, SSN, "\n\n"]


@pytest.fixture(scope="module")
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()


@pytest.fixture(scope="module")
async def stack(nats_server):
    settings = demo_settings(KEY)
    # A tenant whose analysis always times out, and whose policy lets requests on regardless.
    hasty = Tenant(
        name="hasty", api_key_sha256=[hash_key("sk-hasty")], pii=TenantPiiPolicy(timeout_ms=10, fail_open=True)
    )
    settings = msgspec.structs.replace(settings, tenants={**settings.tenants, "hasty": hasty})
    async with Stack(
        nats_server.url,
        settings,
        engines=[PoisonableEngine(PROFILES["zero"])],
        limits=StreamLimits(max_deliver=2, ack_wait_s=2.0),
        prefix="dlqpii",
        pii="regex",
    ) as s:
        yield s


async def dead_letters(nc, stream: str) -> list:
    js = nc.jetstream()
    state = (await js.stream_info(stream)).state
    if not state.messages:
        return []
    return [await js.get_msg(stream, seq) for seq in range(state.first_seq, state.last_seq + 1)]


async def next_dead_letter(nc, stream: str, before: int):
    async def arrived() -> bool:
        return len(await dead_letters(nc, stream)) > before

    assert await eventually(arrived), f"nothing reached {stream}"
    return (await dead_letters(nc, stream))[-1]


def assert_redacted(record) -> GenerateRequest:
    for value in RAW:
        assert value.encode() not in record.data, f"{value!r} is in the dead letter"
    request = codec.decode_request(record.data)
    text = " ".join(request.texts())
    assert "<CREDIT_CARD>" in text and "<EMAIL_ADDRESS>" in text and "<US_SSN>" in text
    assert request.body.stop == ["<EMAIL_ADDRESS>", "<US_SSN>", "\n\n"]
    return request


async def test_a_poison_request_is_dead_lettered_redacted(stack, nc):
    before = len(await dead_letters(nc, "DLQPII_DLQ"))
    async with LanewayClient(nc, "demo", prefix="dlqpii") as client:
        with pytest.raises(LanewayError) as err:
            async for _ in client.generate(chat(f"POISON {TEXT}", max_tokens=256, stop=STOP)):
                pass
    assert err.value.code == "engine_error"
    record = await next_dead_letter(nc, "DLQPII_DLQ", before)
    assert record.headers["Laneway-Reason"] == "engine_error"
    assert assert_redacted(record).request_id == err.value.request_id


def stray(tenant: str, text: str) -> bytes:
    """A request whose reply subject is another tenant's: refused as invalid before the gate runs."""
    now = time.time()
    return codec.encode(
        GenerateRequest(
            request_id="stray-1",
            tenant=tenant,
            klass="interactive",
            model="laneway-sim",
            reply_to="dlqpii.tok.globex.edge",
            created_at=now,
            deadline=now + 60,
            chat=chat(text, max_tokens=256, stop=STOP),
        )
    )


async def test_an_invalid_request_is_dead_lettered_redacted(stack, nc):
    before = len(await dead_letters(nc, "DLQPII_DLQ"))
    await nc.jetstream().publish("dlqpii.req.interactive.demo", stray("demo", TEXT))
    record = await next_dead_letter(nc, "DLQPII_DLQ", before)
    assert record.headers["Laneway-Reason"] == "invalid"
    assert assert_redacted(record).request_id == "stray-1"


async def test_a_body_that_cannot_be_analysed_is_withheld_even_if_the_policy_fails_open(stack, nc):
    before = len(await dead_letters(nc, "DLQPII_DLQ"))
    heavy = " ".join(f"call {400 + i % 500}-555-{1000 + i:04d} or 10.0.{i % 250}.{i % 200}" for i in range(6000))
    body = stray("hasty", f"{TEXT} {heavy}")
    await nc.jetstream().publish("dlqpii.req.interactive.hasty", body)
    record = await next_dead_letter(nc, "DLQPII_DLQ", before)
    assert record.headers["Laneway-Reason"] == "invalid"
    assert (record.headers["Laneway-Body"], record.headers["Laneway-Body-Bytes"]) == ("withheld", str(len(body)))
    assert not record.data


async def test_an_unreadable_body_is_withheld(stack, nc):
    before = len(await dead_letters(nc, "DLQPII_DLQ"))
    body = b"\x93not a request " + TEXT.encode()
    await nc.jetstream().publish("dlqpii.req.interactive.demo", body)
    record = await next_dead_letter(nc, "DLQPII_DLQ", before)
    assert record.headers["Laneway-Reason"] == "malformed"
    assert record.headers["Laneway-Body"] == "withheld"
    assert record.headers["Laneway-Body-Bytes"] == str(len(body))
    assert not record.data


async def test_dead_letters_are_kept_for_a_bounded_time(stack, nc):
    info = await nc.jetstream().stream_info("DLQPII_DLQ")
    assert info.config.max_age == StreamLimits().dlq_max_age_s == 7 * 86400


async def test_max_deliveries_are_dead_lettered_redacted(nats_server, nc):
    """Every delivery dies without an answer: the broker reads the raw request back from LW_REQ
    and dead-letters it redacted. The 'worker' that took it only ever saw it redacted."""
    limits = StreamLimits(max_deliver=2, ack_wait_s=1.0)
    async with Stack(nats_server.url, demo_settings(KEY), engines=[], limits=limits, prefix="mdpii", pii="regex"):
        async with LanewayClient(nc, "demo", prefix="mdpii") as client:

            async def consume() -> None:
                async for _ in client.generate(chat(TEXT, max_tokens=256, stop=STOP)):
                    pass

            pending = asyncio.create_task(consume())
            credit = codec.encode(
                Credit(worker_id="doomed", pool="sim", free_slots=1, token_budget=10**6, total_slots=1, wait_s=1.0)
            )
            seen: list[bytes] = []

            async def take() -> bool:
                reply = await nc.request("mdpii.pull.sim", credit, timeout=5)
                seen.extend(codec.encode(d.request) for d in codec.decode_batch(reply.data).dispatches)
                return len(seen) == 2  # ... and never acked

            assert await eventually(take, interval=0)
            with pytest.raises(LanewayError) as err:
                await pending
            assert err.value.code == "engine_error"
        assert all(value.encode() not in taken for taken in seen for value in RAW)
        record = await next_dead_letter(nc, "MDPII_DLQ", 0)
        assert record.headers["Laneway-Reason"] == "max_deliver"
        assert_redacted(record)
