"""The PII policy document (pure): defaults, validation errors that name the field, actions."""

from __future__ import annotations

import json

import pytest

from broker.gate.pii.redact import Replacer, apply, mask
from broker.pii_analysis.plan import plan_for
from core.policy.pii import (
    DEFAULT_ACTIONS,
    DEFAULT_POLICY,
    KNOWN_ENTITIES,
    Action,
    TenantPiiPolicy,
    decode,
    encode,
    fingerprint,
)
from core.policy.pii.errors import PiiBlocked, PolicyError


def _doc(**fields: object) -> str:
    return json.dumps(fields)


def test_defaults_redact_identifiers_and_fail_closed() -> None:
    p = DEFAULT_POLICY
    assert p.fail_open is False
    for e in ("US_SSN", "CREDIT_CARD", "EMAIL_ADDRESS", "PHONE_NUMBER", "PERSON", "IP_ADDRESS"):
        assert p.action_for(e) is Action.redact
    for e in ("LOCATION", "DATE_TIME", "URL", "ORGANIZATION"):
        assert p.action_for(e) is Action.allow
        assert e not in p.detected()


def test_every_known_entity_has_a_default() -> None:
    assert set(DEFAULT_ACTIONS) == KNOWN_ENTITIES


def test_overrides_and_plan() -> None:
    p = decode(_doc(entities={"US_SSN": "block", "PERSON": "allow", "LOCATION": "mask"}))
    assert p.action_for("US_SSN") is Action.block
    plan = plan_for(p)
    assert "US_SSN" in plan.patterns and "PERSON" not in plan.ner and plan.ner == ("LOCATION",)


def test_all_allowed_plan_is_empty() -> None:
    p = TenantPiiPolicy(entities={e: Action.allow for e in KNOWN_ENTITIES})
    assert plan_for(p).empty


def test_custom_recognizer_declares_a_new_entity_type() -> None:
    p = decode(
        _doc(
            custom=[
                {
                    "name": "employee-id",
                    "entity_type": "EMPLOYEE_ID",
                    "patterns": [{"regex": r"\bEMP-\d{6}\b", "score": 0.7}],
                    "context": ["employee"],
                },
                {"name": "projects", "entity_type": "CODENAME", "deny_list": ["Bluebird", "Nightjar"]},
            ],
            entities={"EMPLOYEE_ID": "hash"},
        )
    )
    assert p.action_for("EMPLOYEE_ID") is Action.hash
    assert p.action_for("CODENAME") is Action.redact  # custom_action default
    assert {"EMPLOYEE_ID", "CODENAME"} <= p.detected()
    assert [c.entity_type for c in plan_for(p).custom] == ["EMPLOYEE_ID", "CODENAME"]


def test_custom_patterns_are_checked_by_the_engine_that_runs_them() -> None:
    # `\p{Lu}` is valid for `regex` (what the recognizers run) and refused by `re`.
    p = decode(_doc(custom=[{"name": "code", "entity_type": "CODE", "patterns": [{"regex": r"\bX-\p{Lu}{3}\b"}]}]))
    assert [c.name for c in p.custom] == ["code"]


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_doc(entities={"FOO_BAR": "block"}), "entities.FOO_BAR"),  # unknown entity type
        (_doc(entities={"US_SSN": "shred"}), "entities.US_SSN"),  # unknown action
        (_doc(entities={"us_ssn": "block"}), "entities.us_ssn"),  # malformed type name
        (_doc(min_score=2), "min_score"),
        (_doc(timeout_ms=0), "timeout_ms"),
        (_doc(fail_closed=True), "fail_closed"),  # unknown field
        (_doc(custom=[{"name": "x", "entity_type": "EMP"}]), "custom[0]"),  # nothing to match
        (
            _doc(custom=[{"name": "x", "entity_type": "EMP", "patterns": [{"regex": "("}]}]),
            "custom[0].patterns[0].regex",
        ),
        (
            _doc(custom=[{"name": "x", "entity_type": "EMP", "patterns": [{"regex": "a*"}]}]),
            "custom[0].patterns[0].regex",
        ),  # matches ""
        (
            _doc(custom=[{"name": "x", "entity_type": "EMP", "patterns": [{"regex": "a", "score": 3}]}]),
            "custom[0].patterns[0].score",
        ),
        (
            _doc(
                custom=[
                    {"name": "x", "entity_type": "EMP", "deny_list": ["a"]},
                    {"name": "x", "entity_type": "EMP2", "deny_list": ["b"]},
                ]
            ),
            "custom[1].name",
        ),
        (_doc(custom=[{"name": "x", "entity_type": "EMP", "deny_list": ["a"], "typo": 1}]), "custom[0].typo"),
        (
            _doc(custom=[{"name": "x", "entity_type": "EMP", "patterns": [{"regex": "x" * 600}]}]),
            "custom[0].patterns[0].regex",
        ),
    ],
)
def test_invalid_documents_name_the_field(doc: str, field: str) -> None:
    with pytest.raises(PolicyError) as err:
        decode(doc)
    assert err.value.field == field
    assert field in str(err.value)


def test_malformed_json() -> None:
    with pytest.raises(PolicyError, match="malformed JSON"):
        decode("{")


def test_unknown_entity_in_entities_is_refused_even_if_allowed() -> None:
    with pytest.raises(PolicyError, match="unknown entity type 'EMAIL'"):
        decode(_doc(entities={"EMAIL": "allow"}))


def test_fingerprint_is_stable_and_tracks_content() -> None:
    a = decode(_doc(entities={"US_SSN": "block", "PERSON": "allow"}))
    b = decode(_doc(entities={"PERSON": "allow", "US_SSN": "block"}))
    assert fingerprint(a) == fingerprint(b) == fingerprint(decode(encode(a)))
    assert fingerprint(a) != fingerprint(DEFAULT_POLICY)


def test_blocked_error_names_types_never_values() -> None:
    err = PiiBlocked(["US_SSN", "CREDIT_CARD", "US_SSN"])
    assert err.entity_types == ["CREDIT_CARD", "US_SSN"]
    assert "US_SSN" in str(err) and err.code == "pii_blocked"


# -- actions (pure string work shared by the gate and the stream redactor) -------------------


def test_mask_keeps_separators_and_last_four_digits_of_long_numbers() -> None:
    assert mask("4111 1111 1111 1234") == "**** **** **** 1234"
    assert mask("078-05-1120") == "***-**-1120"
    assert mask("Maria Garcia") == "***** ******"
    assert mask("a.b@x.io") == "*.*@*.**"


def test_hash_is_keyed_by_secret_and_tenant() -> None:
    one, same, other_tenant, other_key = (
        Replacer(b"k1", "t1"),
        Replacer(b"k1", "t1"),
        Replacer(b"k1", "t2"),
        Replacer(b"k2", "t1"),
    )
    h = one("US_SSN", "078-05-1120", Action.hash)
    assert h.startswith("<US_SSN_") and "078" not in h
    assert h == same("US_SSN", "078-05-1120", Action.hash)
    assert h != other_tenant("US_SSN", "078-05-1120", Action.hash)
    assert h != other_key("US_SSN", "078-05-1120", Action.hash)


def test_apply_merges_overlaps_under_the_strongest_action() -> None:
    text = "call 415-555-0132 now, mail a@b.io"
    spans = [
        (5, 17, "PHONE_NUMBER", Action.mask),
        (5, 16, "US_SSN", Action.redact),
        (28, 34, "EMAIL_ADDRESS", Action.allow),
    ]
    assert apply(text, spans, Replacer(b"k", "t")) == "call <PHONE_NUMBER> now, mail a@b.io"
    # block spans are redacted too, so a blocked request's messages are safe to log by mistake
    assert apply("ssn 078-05-1120", [(4, 15, "US_SSN", Action.block)], Replacer(b"k", "t")) == "ssn <US_SSN>"
