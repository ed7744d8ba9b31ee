"""Streamed output redaction: entities split across deltas are still caught; prose flows."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy.pii import Action, CustomPattern, CustomRecognizer, TenantPiiPolicy
from core.policy.pii.stream import StreamRedactor

POLICY = TenantPiiPolicy()
VALUES = {
    "EMAIL_ADDRESS": "maria.garcia@example.com",
    "PHONE_NUMBER": "+1 (415) 555-0132",
    "US_SSN": "078-05-1120",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "IP_ADDRESS": "192.168.10.24",
}
TEXT = (
    "Sure. Write to maria.garcia@example.com or call +1 (415) 555-0132 today. "
    "Her SSN is 078-05-1120, the card 4111 1111 1111 1111 was charged twice, "
    "and the host 192.168.10.24 keeps failing. Version 2.14.1 shipped on 2025-03-04."
)
EXPECTED = (
    "Sure. Write to <EMAIL_ADDRESS> or call <PHONE_NUMBER> today. "
    "Her SSN is <US_SSN>, the card <CREDIT_CARD> was charged twice, "
    "and the host <IP_ADDRESS> keeps failing. Version 2.14.1 shipped on 2025-03-04."
)


def stream(text: str, cuts: list[int], redactor: StreamRedactor) -> list[str]:
    pieces, pos = [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        pieces.append(redactor.feed(text[pos:cut]))
        pos = cut
    pieces.append(redactor.flush())
    return pieces


def test_entities_split_character_by_character_are_redacted() -> None:
    r = StreamRedactor.for_policy(POLICY)
    out = stream(TEXT, list(range(len(TEXT))), r)
    assert "".join(out) == EXPECTED
    for value in VALUES.values():
        assert not any(value[:6] in piece for piece in out)
    assert [e for e, _, _ in r.found] == ["EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD", "IP_ADDRESS"]
    for etype, start, end in r.found:
        assert TEXT[start:end] == VALUES[etype]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(TEXT)), max_size=40))
def test_any_split_gives_the_same_output(cuts: list[int]) -> None:
    assert "".join(stream(TEXT, cuts, StreamRedactor.for_policy(POLICY))) == EXPECTED


def test_prose_is_released_with_one_word_of_delay() -> None:
    r = StreamRedactor.for_policy(POLICY)
    assert r.feed("The deploy finished without errors and ") == "The deploy finished without errors and "
    assert r.feed("every") == ""
    assert r.feed(" check passed") == "every check "
    assert r.flush() == "passed"


def test_a_number_in_progress_is_held_whole() -> None:
    r = StreamRedactor.for_policy(POLICY)
    out = r.feed("call 415 ") + r.feed("555 ") + r.feed("0132 ")
    assert "415" not in out and "555" not in out
    out += r.feed("please") + r.flush()
    assert out == "call <PHONE_NUMBER> please"


def test_invalid_lookalikes_pass() -> None:
    text = "card 4111 1111 1111 1112, ssn 000-12-3456, ip 999.1.1.1, order 2025-03-04 at 10:30"
    r = StreamRedactor.for_policy(POLICY)
    assert "".join(stream(text, list(range(0, len(text), 3)), r)) == text


def test_policy_actions_apply_and_allow_skips() -> None:
    policy = TenantPiiPolicy(
        entities={"EMAIL_ADDRESS": Action.allow, "US_SSN": Action.mask, "CREDIT_CARD": Action.block}
    )
    r = StreamRedactor.for_policy(policy)
    out = "".join(stream(TEXT, list(range(0, len(TEXT), 5)), r))
    assert "maria.garcia@example.com" in out  # allowed
    assert "***-**-1120" in out  # masked
    assert "<CREDIT_CARD>" in out  # output cannot be refused mid-stream: redacted


def test_custom_patterns_and_deny_list() -> None:
    policy = TenantPiiPolicy(
        custom=[
            CustomRecognizer(name="emp", entity_type="EMPLOYEE_ID", patterns=[CustomPattern(r"EMP-\d{6}")]),
            CustomRecognizer(name="code", entity_type="CODENAME", deny_list=["Project Nightjar"]),
        ]
    )
    text = "Ask EMP-123456 about Project Nightjar before Friday."
    r = StreamRedactor.for_policy(policy, hold=32)
    pieces = stream(text, list(range(len(text))), r)
    assert "".join(pieces) == "Ask <EMPLOYEE_ID> about <CODENAME> before Friday."
    assert not any("Nightjar" in p or "123456" in p for p in pieces)


def test_a_giant_token_is_released_rather_than_held_forever() -> None:
    r = StreamRedactor.for_policy(POLICY, max_hold=100)
    blob = "x" * 500
    assert r.feed(blob) == "x" * 400
    assert r.flush() == "x" * 100


def test_random_chats_never_leak_values() -> None:
    rng = random.Random(3)
    for _ in range(50):
        parts = [rng.choice(["hello", "the", "order", "2.1.0", "at", "10:30", "and"]) for _ in range(20)]
        etype = rng.choice(sorted(VALUES))
        parts.insert(rng.randrange(len(parts)), VALUES[etype])
        text = " ".join(parts) + "."
        cuts = [rng.randrange(len(text)) for _ in range(rng.randrange(1, 30))]
        pieces = stream(text, cuts, StreamRedactor.for_policy(POLICY))
        assert VALUES[etype] not in "".join(pieces)
        assert f"<{etype}>" in "".join(pieces)
