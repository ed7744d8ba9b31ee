"""Raw PII is nowhere at rest: `laneway up` with the PII stage on (NER, so names count too) takes
seeded requests through the bridge holding every entity type the default policy redacts, in
messages and in stop sequences, one of them dead-lettered; once it has stopped, no file under
its data dir (JetStream's store, the logs, the settings) holds any raw value."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from core.policy.pii import DEFAULT_ACTIONS, Action
from loadtest.processes import LanewayUp
from schemas import codec
from schemas.requests import GenerateRequest
from schemas.work import Credit
from tests.requests import chat as chat_body
from tests.wait import eventually

KEY = "sk-pii-at-rest"
# One value per entity type the default policy redacts. Found with no context at all, so they
# are also sent as stop sequences (a stop sequence has no words around it):
BARE = {
    "PERSON": "Maria Garcia",
    "EMAIL_ADDRESS": "maria.garcia@example.com",
    "PHONE_NUMBER": "(415) 555-0132",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "IBAN_CODE": "DE89 3704 0044 0532 0130 00",
    "US_SSN": "536-22-8726",
    "IP_ADDRESS": "192.168.1.20",
    "CRYPTO": "1BoatSLRHtKNngkdXEeobR76b53LETtpyT",
    "UK_NHS": "943 476 5919",
    "US_ITIN": "912-70-1234",
}
# ... and those Presidio only scores high enough next to their context words.
IN_CONTEXT = {
    "US_BANK_NUMBER": ("bank account number", "945500012345"),
    "US_PASSPORT": ("passport number", "912803456"),
    "US_DRIVER_LICENSE": ("driver license number", "A1234567"),
    "MEDICAL_LICENSE": ("medical license", "BM1234563"),
}
RAW = [*BARE.values(), *(value for _, value in IN_CONTEXT.values())]
DOCUMENT = (
    f"Ticket from {BARE['PERSON']} ({BARE['EMAIL_ADDRESS']}), who called from {BARE['PHONE_NUMBER']}. "
    f"Refund card {BARE['CREDIT_CARD']} to IBAN {BARE['IBAN_CODE']}. SSN {BARE['US_SSN']}, "
    f"ITIN {BARE['US_ITIN']}, NHS number {BARE['UK_NHS']}. Seen from {BARE['IP_ADDRESS']}; "
    f"paid in bitcoin to {BARE['CRYPTO']}. "
    + " ".join(f"Their {words} is {value}." for words, value in IN_CONTEXT.values())
)
STOPS = [list(BARE.values())[i : i + 4] for i in range(0, len(BARE), 4)]  # at most 4 per request


def test_the_seed_covers_every_redacted_entity_type():
    redacted = {e for e, action in DEFAULT_ACTIONS.items() if action is not Action.allow}
    assert redacted == set(BARE) | set(IN_CONTEXT)


async def chat(
    http: aiohttp.ClientSession, stop: list[str], headers: dict[str, str] | None = None, **extra
) -> tuple[int, str]:
    body = {
        "model": "laneway-sim",
        "max_tokens": 8,
        "stop": stop,
        "messages": [
            {"role": "system", "content": "You are a support copilot."},
            {"role": "user", "content": DOCUMENT},
        ],
        **extra,
    }
    headers = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    async with http.post("/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.text()


async def dead_letter_after_max_deliver(http: aiohttp.ClientSession, up: LanewayUp) -> bytes:
    """The 'batch' class has no real worker here (it takes interactive and standard only): a
    doomed one takes each delivery and never answers, until JetStream gives up and the broker
    dead-letters the request. Returns the LW_DLQ record, read as the ops user."""
    nc = await up.connect_nats("svc-worker")
    ops = await up.connect_nats("ops")
    try:
        answer = asyncio.create_task(chat(http, STOPS[0], headers={"x-laneway-class": "batch"}))
        credit = codec.encode(
            Credit(
                worker_id="doomed",
                pool="sim",
                free_slots=1,
                token_budget=10**6,
                total_slots=1,
                classes=["batch"],
                wait_s=1.0,
            )
        )
        taken = 0

        async def take() -> bool:
            nonlocal taken
            reply = await nc.request("lw.pull.sim", credit, timeout=5)
            taken += len(codec.decode_batch(reply.data).dispatches)
            return taken == 2  # the --max-deliver below

        assert await eventually(take, interval=0)
        status, text = await answer
        assert status >= 500 and "engine_error" in text
        js = ops.jetstream()
        assert await eventually(lambda: _stored(js, "LW_DLQ"))
        return (await js.get_last_msg("LW_DLQ", "lw.dlq.batch.demo")).data
    finally:
        await nc.close()
        await ops.close()


async def stop_with_one_waiting(up: LanewayUp) -> None:
    """One request still waits when `up` stops (published straight to JetStream, in the 'batch'
    class nothing takes, for an inbox nobody reads): JetStream keeps a block while any message
    in it is unacked, with the raw bytes of the acked requests beside it."""
    nc = await up.connect_nats("svc-bridge")
    try:
        now = time.time()
        request = GenerateRequest(
            request_id="left-waiting",
            tenant="demo",
            klass="batch",
            model="laneway-sim",
            reply_to="lw.tok.demo.nobody",
            created_at=now,
            deadline=now + 600,
            chat=chat_body(DOCUMENT, max_tokens=256, stop=STOPS[1]),
        )
        await nc.jetstream().publish("lw.req.batch.demo", codec.encode(request))
    finally:
        await nc.close()


async def _stored(js, stream: str) -> bool:
    return (await js.stream_info(stream)).state.messages > 0


async def test_no_raw_pii_under_the_data_dir_after_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LANEWAY_LOG_LEVEL", "DEBUG")  # every process logs all it can
    data = tmp_path / "lw"
    async with LanewayUp(
        data,
        KEY,
        [
            "--pii",
            "ner",
            "--sim-profile",
            "zero",
            "--max-deliver",
            "2",
            "--ack-wait",
            "2",
            "--in-progress-interval",
            "0.5",
            "--classes",
            "interactive",
            "standard",
        ],
    ) as up:
        async with aiohttp.ClientSession(base_url=up.url) as http:
            for i, stop in enumerate(STOPS):
                status, text = await chat(http, stop, stream=i % 2 == 1)
                assert status == 200, text
            status, text = await chat(http, STOPS[1], temperature=0)  # cached, under a redacted key
            assert status == 200, text
            record = await dead_letter_after_max_deliver(http, up)
            await stop_with_one_waiting(up)
    assert b"<US_SSN>" in record and b"<PERSON>" in record  # the DLQ kept the redacted request

    files = [p for p in data.rglob("*") if p.is_file()]
    assert any(p.suffix == ".blk" for p in files) and any(p.suffix == ".log" for p in files)
    leaks = [(value, str(p.relative_to(data))) for p in files for value in RAW if value.encode() in p.read_bytes()]
    assert leaks == []
