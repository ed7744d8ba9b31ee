"""Prefix affinity: the index of what each worker holds, the choice among parked pulls, and the
lanes' bounded preference (broker/affinity.py, broker/lanes.py)."""

from __future__ import annotations

from collections import deque

from broker.affinity import (
    CHUNK_CHARS,
    CHUNK_TOKENS,
    FORGET_AFTER_S,
    MAX_CHUNKS,
    Offer,
    PrefixIndex,
    choose,
    prefix_hashes,
)
from broker.lanes import AFFINITY_SLACK_COST, AFFINITY_SLACK_S, Lanes
from broker.waiting import Item
from core.policy.classes import DEFAULT_CLASSES

SYSTEM = "s" * (CHUNK_CHARS * 4)


def test_hashes_name_the_whole_prefix_and_the_tenant_scope():
    a = prefix_hashes([SYSTEM, "hello " * 100], "scope-a")
    longer = prefix_hashes([SYSTEM, "hello " * 100, "more " * 200], "scope-a")
    assert len(a) == len(SYSTEM + "hello " * 100) // CHUNK_CHARS
    assert longer[: len(a)] == a  # a longer conversation extends it
    # Another tenant scope's identical prompt shares no entry: no affinity, no timing channel.
    assert not set(prefix_hashes([SYSTEM], "scope-b")) & set(prefix_hashes([SYSTEM], "scope-a"))
    # Chained: the same chunk after a different start is a different entry.
    assert prefix_hashes(["x" * CHUNK_CHARS, SYSTEM], "s")[1] != prefix_hashes([SYSTEM], "s")[0]
    assert prefix_hashes(["short"], "s") == ()


def test_index_counts_leading_chunks_and_ages_by_kv_size():
    index = PrefixIndex()
    index.heard("w1", kv_tokens=8 * CHUNK_TOKENS, now=0.0)  # room for 8 chunks
    first = prefix_hashes([SYSTEM + "a" * CHUNK_CHARS * 2], "t")  # 6 chunks
    index.record("w1", first, 0.0)
    assert index.overlap("w1", first) == 6 * CHUNK_TOKENS
    other = prefix_hashes([SYSTEM + "b" * CHUNK_CHARS * 2], "t")  # shares the 4 system chunks
    assert index.overlap("w1", other) == 4 * CHUNK_TOKENS
    assert index.overlap("w2", first) == 0
    index.record("w1", prefix_hashes(["z" * CHUNK_CHARS * 4], "t"), 0.0)  # 4 more: the oldest 2 go
    assert len(index) == 8
    assert index.overlap("w1", first) == 4 * CHUNK_TOKENS  # its tail went first: the head still leads
    index.heard("w2", kv_tokens=0, now=0.0)  # no KV size: nothing is kept
    index.record("w2", first, 0.0)
    assert index.overlap("w2", first) == 0


def test_a_silent_worker_is_forgotten():
    index = PrefixIndex()
    p = prefix_hashes([SYSTEM], "t")
    for w in ("w1", "w2"):
        index.heard(w, 10_000, now=0.0)
        index.record(w, p, 0.0)
    index.heard("w1", 10_000, now=FORGET_AFTER_S)
    assert index.best_elsewhere("w1", p, now=FORGET_AFTER_S) == 0  # w2 went quiet
    assert index.forget_silent(FORGET_AFTER_S) == ["w2"]
    assert index.overlap("w2", p) == 0


def test_choose_prefers_the_cached_worker_within_the_balance():
    offers = [Offer("w1", load=10, pending_prefill=0), Offer("w2", load=10, pending_prefill=0)]
    assert choose(offers, 2000, [0, 1800]) == 1
    # The holder is more than 20% busier than the least loaded: passed over.
    offers = [Offer("w1", load=10, pending_prefill=0), Offer("w2", load=13, pending_prefill=0)]
    assert choose(offers, 2000, [0, 1800]) == 0
    # Within the bound it still wins.
    offers = [Offer("w1", load=10, pending_prefill=0), Offer("w2", load=12, pending_prefill=0)]
    assert choose(offers, 2000, [0, 1800]) == 1
    # Nothing cached anywhere: the least loaded, then the longest parked.
    assert choose([Offer("a", 5, 0), Offer("b", 3, 0), Offer("c", 3, 0)], 500, [0, 0, 0]) == 1
    # A hit behind a long queued prefill loses to an idle worker.
    assert choose([Offer("a", 4, 9000), Offer("b", 4, 0)], 2000, [1800, 0]) == 1


def test_a_hot_prefix_spreads_by_load():
    """Every session shares the system prompt: each worker holds it, so new sessions go by load."""
    loads = [0, 0, 0, 0]
    for _ in range(40):
        offers = [Offer(f"w{i}", load, 0) for i, load in enumerate(loads)]
        loads[choose(offers, 1600, [1500] * 4)] += 1
    assert max(loads) - min(loads) <= 1


def _item(
    rid: str, tenant: str = "acme", enqueued: float = 0.0, prefix: tuple[int, ...] = (), klass: str = "interactive"
) -> Item:
    return Item(rid, tenant, klass, cost=600, deadline=enqueued + 100, enqueued_at=enqueued, prefix=prefix)


def _select(lanes: Lanes, prefer, slots: int = 1, now: float = 1.0) -> list[str]:
    chosen = lanes.select(free_slots=slots, token_budget=10**9, total_slots=64, running={}, now=now, prefer=prefer)
    return [i.request_id for i in chosen.dispatch]


def _score(held: set[str]):
    return lambda item: 1.0 if item.request_id in held else 0.0


def test_lanes_prefer_within_the_age_slack_only():
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(_item("head", enqueued=0.0), now=0.0)
    lanes.admit(_item("near", enqueued=AFFINITY_SLACK_S / 2), now=0.0)
    lanes.admit(_item("far", enqueued=AFFINITY_SLACK_S * 4), now=0.0)
    assert _select(lanes, _score({"near"})) == ["near"]
    assert _select(lanes, _score({"far"})) == ["head"]  # too much younger: order holds
    assert _select(lanes, _score({"far"})) == ["far"]


def test_lanes_prefer_never_crosses_a_class_or_the_fair_share_slack():
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(_item("chat"), now=0.0)
    lanes.admit(_item("bulk", klass="batch"), now=0.0)
    assert _select(lanes, _score({"bulk"})) == ["chat"]  # rank first, whatever the score
    lanes = Lanes(DEFAULT_CLASSES)
    for n in range(12):  # acme runs ahead in virtual time
        lanes.admit(_item(f"a{n}", "acme", enqueued=n * 0.001), now=0.0)
    lanes.admit(_item("b0", "beta", enqueued=0.0), now=0.0)
    served = []
    for _ in range(13):
        served += _select(lanes, _score({f"a{n}" for n in range(12)}))
    # beta is passed over while within the slack, served once acme is a slack ahead of it
    assert served.index("b0") <= AFFINITY_SLACK_COST / 600 + 2
    assert sorted(served) == sorted([f"a{n}" for n in range(12)] + ["b0"])  # each exactly once


def test_peek_is_what_a_pull_takes_first_and_changes_nothing():
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(_item("bulk", klass="batch"), now=0.0)
    lanes.admit(_item("chat", enqueued=0.1), now=0.1)
    assert lanes.peek(now=1.0).request_id == "chat"
    assert len(lanes) == 2
    assert _select(lanes, None) == ["chat"]


def test_sessions_stay_with_their_history_and_spread_evenly():
    """Sessions sharing one system prompt, a few requests running at a time: without the share of
    recent dispatches every session would follow the system prompt to the first worker."""
    index, workers, sessions = PrefixIndex(), ["w0", "w1", "w2", "w3"], 40
    for w in workers:
        index.heard(w, kv_tokens=10**6, now=0.0)
    history = {s: SYSTEM for s in range(sessions)}
    home: dict[int, str] = {}
    served = dict.fromkeys(workers, 0)
    running: deque[str] = deque(maxlen=6)  # the last few dispatches are still running
    stayed = follow_ups = 0
    now = 0.0
    for turn in range(6):
        for s in range(sessions):
            now += 0.05
            history[s] += f" session {s} turn {turn} " + "q" * CHUNK_CHARS
            prefix = prefix_hashes([history[s]], "t")
            offers = [Offer(w, running.count(w), 0, index.share(w, now), 256, 8192) for w in workers]
            chosen = workers[choose(offers, len(history[s]) // 4, [index.overlap(w, prefix) for w in workers])]
            if s in home:
                follow_ups += 1
                stayed += home[s] == chosen
            home[s] = chosen
            served[chosen] += 1
            running.append(chosen)
            index.record(chosen, prefix, now)
    mean = sessions * 6 / len(workers)
    assert all(abs(n / mean - 1) <= 0.25 for n in served.values()), served
    assert stayed / follow_ups >= 0.9, (stayed, follow_ups)


def test_an_idle_pool_keeps_a_conversation_where_it_is():
    """One conversation, nothing else running: it never moves for the sake of balance."""
    index, workers = PrefixIndex(), ["w0", "w1"]
    for w in workers:
        index.heard(w, kv_tokens=10**6, now=0.0)
    history, homes = SYSTEM, []
    for turn in range(8):
        history += f" turn {turn} " + "q" * CHUNK_CHARS
        prefix = prefix_hashes([history], "t")
        offers = [Offer(w, 0, 0, index.share(w, float(turn)), 256, 8192) for w in workers]
        homes.append(workers[choose(offers, len(history) // 4, [index.overlap(w, prefix) for w in workers])])
        index.record(homes[-1], prefix, float(turn))
    assert len(set(homes)) == 1, homes


def test_a_very_long_prompt_hashes_a_bounded_prefix():
    assert len(prefix_hashes(["x" * CHUNK_CHARS * (MAX_CHUNKS + 50)], "t")) == MAX_CHUNKS


def test_lanes_prefer_never_serves_a_later_deadline_first_beyond_the_slack():
    """An item admitted earlier but due much later is not an affinity candidate ahead of the head."""
    lanes = Lanes(DEFAULT_CLASSES)
    late = Item("late", "acme", "interactive", cost=600, deadline=3600.0, enqueued_at=0.0)
    due = Item("due", "acme", "interactive", cost=600, deadline=5.0, enqueued_at=4.0)
    lanes.admit(late, now=0.0)
    lanes.admit(due, now=4.0)
    assert lanes.peek(now=4.5).request_id == "due"
    assert _select(lanes, _score({"late"}), now=4.5) == ["due"]
