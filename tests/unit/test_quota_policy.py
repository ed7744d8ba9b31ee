"""Quota policy parsing, the 429 data, and the pure counter arithmetic (no server)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.gate.quota import GrantLedger
from core.policy.quota import (
    INSUFFICIENT_QUOTA,
    RATE_LIMITED,
    BadQuotaPolicy,
    BudgetDoc,
    LimitName,
    QuotaExceeded,
    QuotaGrant,
    QuotaPolicy,
    RateDoc,
    RateState,
    SlotsDoc,
    format_reset,
    lease_chunk,
    minute_of,
    month_of,
    parse_policy,
    rate_limit_headers,
    return_budget,
    return_rate,
    seconds_to_month_end,
    set_slots,
    take_budget,
    take_rate,
)


def test_policy_from_toml_table_and_json() -> None:
    p = parse_policy("acme", {"requests_per_min": 600, "tokens_per_min": 200_000})
    assert p == QuotaPolicy(requests_per_min=600, tokens_per_min=200_000)
    assert not p.unlimited and QuotaPolicy().unlimited
    assert parse_policy("acme", b'{"max_concurrent": 4, "monthly_tokens": 1000000}').max_concurrent == 4


@pytest.mark.parametrize(
    "raw, param",
    [
        ({"requests_per_min": 0}, "requests_per_min"),
        ({"tokens_per_min": -5}, "tokens_per_min"),
        ({"max_concurrent": "many"}, "max_concurrent"),
        ({"monthly_tokens": 1.5}, "monthly_tokens"),
        ({"requests_per_minute": 10}, "requests_per_minute"),  # a typo is refused, not ignored
        (b'{"max_concurrent": 2,', None),
    ],
)
def test_bad_policy_names_the_field(raw, param) -> None:
    with pytest.raises(BadQuotaPolicy) as err:
        parse_policy("acme", raw)
    assert err.value.param == param
    assert err.value.tenant == "acme" and "acme" in str(err.value)


@pytest.mark.parametrize("seconds, text", [(0.02, "20ms"), (7, "7s"), (6.2, "7s"), (360, "6m0s"), (3723, "1h2m3s")])
def test_reset_format(seconds, text) -> None:
    assert format_reset(seconds) == text


def test_headers_of_a_rate_refusal() -> None:
    exc = QuotaExceeded(
        "acme",
        LimitName.requests,
        60,
        0,
        12.3,
        "rate limit reached",
        requests=RateState(60, 0, 12.3),
        tokens=RateState(10_000, 4_200, 12.3),
    )
    assert exc.code == RATE_LIMITED and exc.retry_after_s == 13
    assert rate_limit_headers(exc) == {
        "Retry-After": "13",
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "13s",
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "4200",
        "x-ratelimit-reset-tokens": "13s",
    }


def test_budget_refusal_is_insufficient_quota() -> None:
    exc = QuotaExceeded("acme", LimitName.budget, 1000, -3, 86400.0, "budget spent")
    assert exc.code == INSUFFICIENT_QUOTA and exc.remaining == 0
    assert rate_limit_headers(exc) == {"Retry-After": "86400"}  # no rate limits configured


def test_grant_headers_have_no_retry_after() -> None:
    grant = QuotaGrant("acme", 10, 1, -1, False, requests_state=RateState(5, 4, 30.0))
    assert rate_limit_headers(grant) == {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "30s",
    }


def test_periods() -> None:
    t = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC).timestamp()
    assert month_of(t) == 202612 and seconds_to_month_end(t) == pytest.approx(30)
    assert minute_of(t) == int(t // 60) and minute_of(t + 30) == minute_of(t) + 1
    assert lease_chunk(5, 0.1) == 1 and lease_chunk(600, 0.1) == 60


POLICY = QuotaPolicy(requests_per_min=10, tokens_per_min=1000)


def test_take_rate_all_or_nothing() -> None:
    take = take_rate(None, 7, POLICY, need_requests=1, need_tokens=300, want_requests=3, want_tokens=500)
    assert take.doc == RateDoc(7, 3, 500) and (take.got_requests, take.got_tokens) == (3, 500)
    assert (take.left_requests, take.left_tokens) == (7, 500)
    denied = take_rate(RateDoc(7, 3, 900), 7, POLICY, 1, 300, 3, 300)
    assert denied.denied is LimitName.tokens and denied.doc is None and denied.got_requests == 0
    denied = take_rate(RateDoc(7, 10, 0), 7, POLICY, 1, 0, 1, 0)
    assert denied.denied is LimitName.requests and denied.left_requests == 0


def test_take_rate_windows() -> None:
    fresh = take_rate(RateDoc(6, 10, 1000), 7, POLICY, 1, 10, 1, 10)
    assert fresh.doc == RateDoc(7, 1, 10)  # a new minute starts from zero
    ahead = take_rate(RateDoc(8, 2, 0), 7, POLICY, 1, 0, 1, 0)
    assert ahead.period == 8 and ahead.doc == RateDoc(8, 3, 0)  # never reset a newer window
    over = take_rate(RateDoc(7, 0, 1200), 7, POLICY, 1, 0, 1, 100)
    assert over.doc == RateDoc(7, 1, 1200) and over.got_tokens == 0  # a debt is not leased out


def test_return_rate_only_into_its_own_window() -> None:
    assert return_rate(RateDoc(7, 5, 500), 7, 2, 200) == RateDoc(7, 3, 300)
    assert return_rate(RateDoc(7, 5, 500), 7, 0, -50) == RateDoc(7, 5, 550)  # a debt paid
    assert return_rate(RateDoc(8, 5, 500), 7, 2, 200) is None
    assert return_rate(None, 7, 2, 200) is None


def test_budget_take_and_return() -> None:
    take = take_budget(BudgetDoc(202611, 900), 202611, 1000, need=50, want=80)
    assert take.doc == BudgetDoc(202611, 980) and take.got_tokens == 80 and take.left_tokens == 20
    assert take_budget(BudgetDoc(202611, 990), 202611, 1000, 50, 50).denied is LimitName.budget
    assert take_budget(BudgetDoc(202610, 1000), 202611, 1000, 50, 50).doc == BudgetDoc(202611, 50)
    assert return_budget(BudgetDoc(202611, 980), 202611, 30) == BudgetDoc(202611, 950)


def test_slots_expire_with_their_holder() -> None:
    doc = SlotsDoc({"a": (3, 100.0), "dead": (2, 50.0)})
    take = set_slots(doc, "b", now=60.0, ttl_s=30, limit=5, in_use=0, want_spare=4, need_spare=1)
    assert take.doc.holders == {"a": (3, 100.0), "b": (2, 90.0)} and take.got_requests == 2
    full = set_slots(take.doc, "c", now=60.0, ttl_s=30, limit=5, in_use=0, want_spare=1, need_spare=1)
    assert full.denied is LimitName.concurrency and full.doc is None
    shrink = set_slots(take.doc, "b", now=61.0, ttl_s=30, limit=5, in_use=0, want_spare=0, need_spare=0)
    assert shrink.doc.holders == {"a": (3, 100.0)}  # nothing held: the entry goes


def test_ledger_releases_grants_whose_request_never_ended() -> None:
    ledger = GrantLedger(grace_s=10)
    g1, g2 = QuotaGrant("a", 1, -1, -1, True), QuotaGrant("a", 1, -1, -1, True)
    ledger.hold("a", "r1", g1, deadline=100.0)
    ledger.hold("a", "r2", g2, deadline=200.0)
    assert ledger.expired(now=105.0) == []
    assert ledger.expired(now=111.0) == [g1] and len(ledger) == 1
    assert ledger.pop("a", "r2") is g2 and ledger.pop("a", "r2") is None
