"""The broker's verdict on a request id it finds taken (broker/received.py), without a server."""

from __future__ import annotations

from broker.received import WINDOW_S, Receipt, Verdict, ttl_s, verdict
from schemas.requests import GenerateRequest
from tests.requests import chat


def test_a_redelivery_is_the_message_that_claimed_the_id() -> None:
    assert verdict(Receipt(7, "a"), Receipt(7, "b"), escalated=False) is Verdict.FIRST


def test_the_same_publish_stored_twice_is_a_copy_another_publish_a_duplicate() -> None:
    assert verdict(Receipt(7, "a"), Receipt(8, "a"), escalated=False) is Verdict.COPY
    assert verdict(Receipt(7, "a"), Receipt(8, "b"), escalated=False) is Verdict.DUPLICATE
    assert verdict(Receipt(7, ""), Receipt(8, ""), escalated=False) is Verdict.DUPLICATE  # no id: not the same


def test_a_second_escalation_is_a_copy_whatever_its_publish() -> None:
    assert verdict(Receipt(7, "a"), Receipt(8, "b"), escalated=True) is Verdict.COPY


def test_the_key_outlives_the_request_and_the_old_window() -> None:
    r = GenerateRequest(
        request_id="x",
        tenant="acme",
        klass="batch",
        model="m",
        reply_to="lw.tok.acme.e",
        created_at=1000.0,
        deadline=2000.0,
        chat=chat("hi"),
    )
    assert ttl_s(r, r.deadline - 600) == 600
    assert ttl_s(r, r.deadline - 1) == WINDOW_S
