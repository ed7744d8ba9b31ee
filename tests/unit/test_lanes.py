"""The scheduling policy, driven without any server: priority, aging, fairness, EDF, terminal states."""

from __future__ import annotations

import itertools
from collections import Counter

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.lanes import ACTIVE_WINDOW_S, Lanes
from broker.waiting import Admit, Item, State
from core.policy.classes import DEFAULT_CLASSES, ClassPolicy

_ids = itertools.count()


def item(tenant="t1", klass="interactive", cost=100, deadline=1e9, at=0.0, redelivered=False) -> Item:
    return Item(f"r{next(_ids)}", tenant, klass, cost, deadline, at, redelivered=redelivered)


def take(
    lanes: Lanes,
    now: float = 0.0,
    slots: int = 1,
    budget: int = 10**9,
    total: int = 100,
    running: dict[str, int] | None = None,
):
    return lanes.select(free_slots=slots, token_budget=budget, total_slots=total, running=running or {}, now=now)


def test_higher_rank_class_is_served_first():
    lanes = Lanes(DEFAULT_CLASSES)
    batch = [item(klass="batch") for _ in range(5)]
    chat = item(klass="interactive")
    for it in batch:
        assert lanes.admit(it, 0.0) is Admit.OK
    lanes.admit(chat, 0.0)
    assert take(lanes).dispatch == [chat]


def test_aging_serves_a_starving_class_ahead_of_rank():
    lanes = Lanes(DEFAULT_CLASSES)
    old_batch = item(klass="batch", at=0.0)
    lanes.admit(old_batch, 0.0)
    chats = [item(klass="interactive", at=40.0) for _ in range(3)]
    for c in chats:
        lanes.admit(c, 40.0)
    # batch starve_after_s = 30: at t=40 its head is overdue and goes first.
    assert take(lanes, now=40.0).dispatch == [old_batch]


def test_slot_share_cap_keeps_headroom_for_higher_classes():
    lanes = Lanes(DEFAULT_CLASSES)
    for _ in range(20):
        lanes.admit(item(klass="batch"), 0.0)
    got = take(lanes, slots=10, total=10)
    assert len(got.dispatch) == 9  # batch may hold 90% of 10 slots
    assert take(lanes, slots=1, total=10, running={"batch": 9}).dispatch == []


def test_the_classes_under_a_chat_leave_it_its_headroom_together_not_each_on_its_own():
    """32 slots: batch may hold 28 (0.9), standard with batch 30 (0.95). Each under a share of
    its own, the two floods held 28 + 4 and a chat found no slot."""
    lanes = Lanes(DEFAULT_CLASSES)
    for _ in range(10):
        lanes.admit(item(klass="standard"), 0.0)
        lanes.admit(item(klass="batch"), 0.0)
    running = {"batch": 28}
    got = take(lanes, slots=4, total=32, running=running)
    assert Counter(i.klass for i in got.dispatch) == {"standard": 2}  # 28 + 2 = standard's 30
    running["standard"] = 2
    assert take(lanes, slots=2, total=32, running=running).dispatch == []
    chat = item(klass="interactive")
    lanes.admit(chat, 0.0)
    assert take(lanes, slots=2, total=32, running=running).dispatch == [chat]


def test_edf_within_a_tenant():
    lanes = Lanes(DEFAULT_CLASSES)
    late, soon = item(deadline=100.0), item(deadline=50.0)
    lanes.admit(late, 0.0)
    lanes.admit(soon, 0.0)
    assert take(lanes, slots=2).dispatch == [soon, late]


def test_expired_requests_are_never_dispatched():
    lanes = Lanes(DEFAULT_CLASSES)
    doomed, fine = item(deadline=5.0), item(deadline=500.0)
    lanes.admit(doomed, 0.0)
    lanes.admit(fine, 0.0)
    got = take(lanes, now=10.0, slots=2)
    assert got.dispatch == [fine] and got.expired == [doomed]
    assert doomed.state is State.EXPIRED
    assert lanes.admit(item(deadline=5.0), 10.0) is Admit.EXPIRED


def test_max_queue_wait_expires_in_the_sweep():
    lanes = Lanes(DEFAULT_CLASSES)
    it = item(klass="interactive", at=0.0)
    lanes.admit(it, 0.0)
    assert lanes.expire(29.0) == []
    assert lanes.expire(31.0) == [it] and len(lanes) == 0


def test_tenant_depth_cap_and_unknown_class():
    small = ClassPolicy("x", rank=0, max_queue_wait_s=10, max_tenant_depth=2, max_slot_share=1, starve_after_s=1)
    lanes = Lanes([small])
    assert lanes.admit(item(klass="x"), 0) is Admit.OK
    assert lanes.admit(item(klass="x"), 0) is Admit.OK
    assert lanes.admit(item(klass="x"), 0) is Admit.QUEUE_FULL
    assert lanes.admit(item(klass="x", tenant="t2"), 0) is Admit.OK
    assert lanes.admit(item(klass="nope"), 0) is Admit.UNKNOWN_CLASS


def test_cancel_removes_a_waiting_request():
    lanes = Lanes(DEFAULT_CLASSES)
    it = item()
    lanes.admit(it, 0.0)
    assert lanes.cancel(it.tenant, it.request_id) is it
    assert it.state is State.CANCELLED and take(lanes).dispatch == []
    assert lanes.cancel(it.tenant, it.request_id) is None


def test_token_budget_leaves_big_requests_for_roomier_workers():
    lanes = Lanes(DEFAULT_CLASSES)
    big = item(cost=5000)
    lanes.admit(big, 0.0)
    assert take(lanes, budget=1000, running={"interactive": 1}).dispatch == []
    # An empty worker takes it anyway: otherwise it could never run.
    assert take(lanes, budget=1000).dispatch == [big]


def served_shares(weights: dict[str, float], offered: dict[str, int], rounds: int) -> dict[str, float]:
    lanes = Lanes(DEFAULT_CLASSES, tenant_weight=lambda t: weights[t])
    for tenant, n in offered.items():
        for _ in range(n):
            lanes.admit(item(tenant=tenant, klass="standard", cost=100), 0.0)
    served: dict[str, int] = {t: 0 for t in weights}
    for _ in range(rounds):
        for it in take(lanes, now=1.0).dispatch:
            served[it.tenant] += it.cost
    total = sum(served.values())
    return {t: v / total for t, v in served.items()}


def test_fair_share_equal_weights_under_10_to_1_offered_load():
    shares = served_shares({"a": 1, "b": 1}, {"a": 1000, "b": 100}, rounds=200)
    assert abs(shares["a"] - 0.5) <= 0.05


def test_weighted_share_3_to_1():
    shares = served_shares({"a": 3, "b": 1}, {"a": 1000, "b": 1000}, rounds=400)
    assert abs(shares["a"] - 0.75) <= 0.05


def test_idle_tenant_cannot_bank_credit():
    lanes = Lanes(DEFAULT_CLASSES)
    for _ in range(50):
        lanes.admit(item(tenant="a", klass="standard"), 0.0)
    for _ in range(40):
        take(lanes)
    # b arrives late with a burst: it gets its fair half from now on, not 40 turns in a row.
    for _ in range(20):
        lanes.admit(item(tenant="b", klass="standard"), 1.0)
    got = [take(lanes, now=1.0).dispatch[0].tenant for _ in range(10)]
    assert got.count("b") <= 6


def test_a_redelivered_request_goes_ahead_of_its_class_new_work_every_tenants():
    """A lost worker's request, delivered again, is its client's stalled stream: it goes before
    the new work of its class, whoever's, in the order it came back (issue 36)."""
    lanes = Lanes(DEFAULT_CLASSES)
    for _ in range(100):
        lanes.admit(item(tenant="a", deadline=10.0), 0.0)
    take(lanes, slots=5)  # a has been served: its virtual time is ahead of b's
    back = [item(tenant="a", deadline=20.0, at=1.0, redelivered=True) for _ in range(2)]
    for it in back:
        lanes.admit(it, 1.0)
    lanes.admit(fresh_b := item(tenant="b", deadline=5.0, at=1.0), 1.0)
    assert lanes.peek(1.0) is back[0]
    assert take(lanes, now=1.0, slots=3).dispatch == [*back, fresh_b]
    # A higher class still goes first: a lower class's redelivery does not jump it.
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(old_batch := item(tenant="b", klass="batch", redelivered=True), 2.0)
    lanes.admit(chat := item(tenant="a", at=2.0), 2.0)
    assert take(lanes, now=2.0).dispatch == [chat]
    assert take(lanes, now=2.0).dispatch == [old_batch]


def test_a_redelivered_request_is_not_charged_twice_and_expires_like_any_other():
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(late := item(tenant="a", deadline=1.0, redelivered=True), 0.0)
    lanes.admit(again := item(tenant="a", cost=10**6, redelivered=True), 0.0)
    got = take(lanes, now=2.0)
    assert got.expired == [late] and got.dispatch == [again]
    # Uncharged: a's 10**6-token redelivery leaves it level with b for the next new work.
    for _ in range(4):
        lanes.admit(item(tenant="a"), 2.0)
        lanes.admit(item(tenant="b"), 2.0)
    assert sorted(i.tenant for i in take(lanes, now=2.0, slots=4).dispatch) == ["a", "a", "b", "b"]


# -- properties -----------------------------------------------------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["interactive", "standard", "batch"]),
            st.integers(1, 4000),
            st.floats(0, 200),
            st.booleans(),
        ),
        st.tuples(st.just("select"), st.integers(0, 8), st.integers(0, 20000)),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(
            st.just("expire"),
        ),
        st.tuples(st.just("tick"), st.floats(0, 20)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_every_admitted_request_reaches_exactly_one_terminal_state(script):
    lanes = Lanes(DEFAULT_CLASSES)
    now = 0.0
    admitted: list[Item] = []
    outcomes: dict[int, list[State]] = {}
    running: dict[str, int] = {}
    for op in script:
        if op[0] == "admit":
            _, tenant, klass, cost, ttl, redelivered = op
            it = item(tenant, klass, cost, deadline=now + ttl, at=now, redelivered=redelivered)
            if lanes.admit(it, now) is Admit.OK:
                admitted.append(it)
        elif op[0] == "select":
            got = lanes.select(free_slots=op[1], token_budget=op[2], total_slots=8, running=running, now=now)
            assert len(got.dispatch) <= op[1]
            for it in got.dispatch:
                assert now < it.deadline, "an expired request was dispatched"
                outcomes.setdefault(id(it), []).append(State.DISPATCHED)
            for it in got.expired:
                outcomes.setdefault(id(it), []).append(State.EXPIRED)
        elif op[0] == "cancel" and admitted:
            it = admitted[op[1] % len(admitted)]
            if lanes.cancel(it.tenant, it.request_id) is not None:
                outcomes.setdefault(id(it), []).append(State.CANCELLED)
        elif op[0] == "expire":
            for it in lanes.expire(now):
                outcomes.setdefault(id(it), []).append(State.EXPIRED)
        elif op[0] == "tick":
            now += op[1]
    # Drain: everything still waiting ends by dispatch or expiry.
    now += 10_000
    for it in lanes.expire(now):
        outcomes.setdefault(id(it), []).append(State.EXPIRED)
    assert len(lanes) == 0
    for it in admitted:
        assert outcomes.get(id(it)) == [it.state], (it, outcomes.get(id(it)))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 50), st.floats(0.05, 2.0))
def test_bounded_starvation_under_a_constant_interactive_flood(flood, pull_every):
    """A batch head is served within starve_after_s (+ one pull) even if chats never stop."""
    lanes = Lanes(DEFAULT_CLASSES)
    starve = lanes.policy("batch").starve_after_s
    victim = item(klass="batch", at=0.0, deadline=1e9)
    lanes.admit(victim, 0.0)
    now = 0.0
    while victim.state is State.WAITING:
        for _ in range(flood):
            lanes.admit(item(klass="interactive", at=now, deadline=now + 1e6), now)
        take(lanes, now=now, slots=2)
        now += pull_every
        assert now <= starve + 2 * pull_every + 1e-9
    assert victim.state is State.DISPATCHED


def test_batch_size_is_bounded_by_message_bytes():
    lanes = Lanes(DEFAULT_CLASSES)
    items = [item() for _ in range(10)]
    for it in items:
        it.size = 300_000
        lanes.admit(it, 0.0)
    first = lanes.select(free_slots=10, token_budget=10**9, total_slots=100, running={}, now=0.0, max_bytes=1_000_000)
    assert len(first.dispatch) == 3
    huge = item()
    huge.size = 5_000_000
    lanes2 = Lanes(DEFAULT_CLASSES)
    lanes2.admit(huge, 0.0)
    assert lanes2.select(
        free_slots=1, token_budget=10**9, total_slots=100, running={}, now=0.0, max_bytes=1_000_000
    ).dispatch == [huge]


def _prefill_lanes(share: float = 0.25) -> Lanes:
    batch = msgspec.structs.replace(
        next(c for c in DEFAULT_CLASSES if c.name == "batch"), max_slot_share=1.0, max_prefill_share=share
    )
    return Lanes([c for c in DEFAULT_CLASSES if c.name != "batch"] + [batch])


def _prompt(klass: str, tokens: int) -> Item:
    it = item(klass=klass, cost=tokens + 400)
    it.prompt = tokens
    return it


def _pick(lanes: Lanes, pending: dict[str, int], slots: int = 10, step: int = 8192):
    return lanes.select(
        free_slots=slots,
        token_budget=10**9,
        total_slots=100,
        running={"batch": 1},
        now=0.0,
        step_tokens=step,
        prefill=pending,
    ).dispatch


def test_a_class_prompts_awaiting_prefill_stay_under_its_share_of_the_step():
    lanes = _prefill_lanes(0.25)  # batch: 2,048 of an 8,192-token step
    floods = [_prompt("batch", 1536) for _ in range(4)]
    for it in floods:
        lanes.admit(it, 0.0)
    assert _pick(lanes, {"batch": 1000}) == []  # 1,000 + 1,536 > 2,048
    assert _pick(lanes, {"batch": 500}) == floods[:1]  # 500 + 1,536 fits; a second would not
    chat = _prompt("interactive", 3000)
    lanes.admit(chat, 0.0)
    assert _pick(lanes, {"batch": 2000}) == [chat]  # other classes are not held back


def test_a_class_with_nothing_awaiting_prefill_may_start_one_prompt_longer_than_its_cap():
    lanes = _prefill_lanes(0.1)  # 819 tokens
    long = [_prompt("batch", 6000) for _ in range(2)]
    for it in long:
        lanes.admit(it, 0.0)
    assert _pick(lanes, {}) == long[:1]


def test_no_step_size_reported_means_no_prefill_cap():
    lanes = _prefill_lanes(0.1)
    floods = [_prompt("batch", 1536) for _ in range(3)]
    for it in floods:
        lanes.admit(it, 0.0)
    assert _pick(lanes, {"batch": 5000}, step=0) == floods


def test_a_neighbours_flood_in_the_chats_own_class_waits_here_not_in_the_engine():
    """Interactive has no prefill cap of its own, but a worker holding two steps of unstarted
    interactive prompts takes no more of them: another tenant's chat arriving next is chosen
    here by fair share as soon as the engine starts those, instead of queueing in the engine
    behind a hundred of the neighbour's prompts in arrival order."""
    lanes = Lanes(DEFAULT_CLASSES)
    flood = [_prompt("interactive", 1536) for _ in range(40)]
    for it in flood:
        it.tenant = "globex"
        lanes.admit(it, 0.0)
    taken = _pick(lanes, {}, slots=40)
    assert sum(it.prompt for it in taken[1:]) <= 2 * 8192 < sum(it.prompt for it in taken) + 1536
    pending = {"interactive": sum(it.prompt for it in taken)}
    assert _pick(lanes, pending, slots=40) == []  # the engine has two steps queued
    chat = _prompt("interactive", 512)
    chat.tenant = "acme"
    lanes.admit(chat, 0.0)
    assert _pick(lanes, {"interactive": 2 * 8192 - 600}, slots=40)[0] is chat  # room again: fair share
    assert _pick(lanes, {"batch": 10 * 8192}, slots=1)[0].klass == "interactive"  # lower classes: behind it


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 4000), min_size=1, max_size=20),
    st.integers(0, 3000),
    st.floats(0.05, 0.9),
    st.sampled_from([2048, 8192]),
)
def test_prefill_cap_invariant(prompts, already, share, step):
    lanes = _prefill_lanes(share)
    for tokens in prompts:
        lanes.admit(_prompt("batch", tokens), 0.0)
    chosen = _pick(lanes, {"batch": already} if already else {}, slots=len(prompts), step=step)
    total = already + sum(it.prompt for it in chosen)
    cap = int(share * step)
    assert not chosen or total <= cap or (already == 0 and len(chosen) == 1)
    # Work-conserving within the cap: the next waiting prompt would not have fitted.
    rest = [it for it in lanes.waiting_items() if it.klass == "batch"]
    if rest and chosen:
        head = min(rest, key=lambda it: it.order)
        assert total + head.prompt > cap


# -- tenant headroom within a class ------------------------------------------------------------
def _held(
    lanes: Lanes,
    now: float,
    slots: int,
    held: dict[str, int],
    tokens: dict[str, int] | None = None,
    total: int = 100,
    kv: int = 0,
    budget: int = 10**9,
) -> list[Item]:
    """A pull from a worker of `total` slots whose interactive slots are held per tenant as given."""
    return lanes.select(
        free_slots=slots,
        token_budget=budget,
        total_slots=total,
        running={"interactive": sum(held.values())},
        now=now,
        kv_tokens=kv,
        tenant_slots={"interactive": held},
        tenant_tokens={"interactive": tokens or {}},
    ).dispatch


def test_a_flood_leaves_another_active_tenant_its_share_of_the_class_at_a_worker():
    """acme chats now and then; globex floods the same class. globex takes 90 of the 100 slots,
    not all 99 free: acme's next chat starts at once instead of waiting for a flood request to end."""
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(item("acme"), 0.0)
    assert _held(lanes, 0.0, 100, {}) != []
    for _ in range(200):
        lanes.admit(item("globex"), 1.0)
    flood = _held(lanes, 1.0, 99, {"acme": 1})
    assert len(flood) == 90 and {it.tenant for it in flood} == {"globex"}
    chat = item("acme", at=2.0)
    lanes.admit(chat, 2.0)
    assert _held(lanes, 2.0, 9, {"acme": 1, "globex": 90}) == [chat]
    assert _held(lanes, 2.0, 8, {"acme": 2, "globex": 90}) == []  # globex stays at its cap


def test_a_tenant_at_its_cap_is_passed_over_for_the_next_fair_tenant_not_the_whole_lane():
    lanes = Lanes(DEFAULT_CLASSES)
    lanes.admit(item("acme"), 0.0)
    _held(lanes, 0.0, 1, {})  # acme's virtual time moves on
    floods = [item("globex") for _ in range(10)]
    chats = [item("acme") for _ in range(3)]
    for it in floods + chats:
        lanes.admit(it, 0.0)
    # globex is the fair tenant (the lower virtual time) but holds its 90 of 100 slots here.
    assert _held(lanes, 0.0, 10, {"acme": 0, "globex": 90}) == chats
    # Under its cap again, it is served first as before.
    assert _held(lanes, 0.0, 1, {"globex": 80}) == floods[:1]


def test_a_tenants_kv_tokens_stay_within_its_share_of_the_cache_while_another_is_active():
    lanes = Lanes(DEFAULT_CLASSES)
    floods = [item("globex", cost=500) for _ in range(10)]
    chat = item("acme", cost=500)
    for it in [*floods, chat]:
        lanes.admit(it, 0.0)
    # 10,000 KV tokens, globex holds 4,600 of them in 4 of 100 slots: one more (500) passes its
    # step share (interactive: half), 5,000.
    got = _held(lanes, 0.0, 10, {"globex": 4}, {"globex": 4600}, kv=10_000)
    assert got == [chat]
    assert _held(lanes, 0.0, 10, {"globex": 4}, {"globex": 4000}, kv=10_000) == floods[:2]


def test_a_tenant_whose_weight_is_the_larger_part_holds_that_part_of_a_workers_steps():
    """Weights 3:1 while both are active: globex may hold 75% of a worker's KV cache, more than
    the interactive class's step share (half), so the lanes' weighted fair queuing is not undone
    at the worker; at equal weights it is held to half."""
    weights = {"globex": 3.0}
    lanes = Lanes(DEFAULT_CLASSES, lambda tenant: weights.get(tenant, 1.0))
    for _ in range(100):
        lanes.admit(item("globex", cost=100), 0.0)
    lanes.admit(item("acme", cost=100), 0.0)
    got = _held(lanes, 0.0, 99, {"acme": 1}, {"acme": 100}, kv=10_000)
    assert Counter(it.tenant for it in got) == {"globex": 75, "acme": 1}
    weights.clear()
    assert _held(lanes, 0.0, 24, {"acme": 1, "globex": 75}, {"globex": 7_500}, kv=10_000) == []
    assert [it.tenant for it in _held(lanes, 0.0, 51, {"acme": 1, "globex": 49}, {"globex": 4_900}, kv=10_000)] == [
        "globex"
    ]


def test_a_neighbours_burst_of_long_prompts_fills_at_most_its_share_of_a_workers_next_steps():
    """globex's prompts not yet prefilled at a worker stay within its share (half) of the two
    steps a worker may hold unstarted while acme is active: a burst of long prompts, started
    together, would fill every step's chunks and acme's chat would take its steps behind them."""
    lanes = Lanes(DEFAULT_CLASSES)
    burst = [Item(f"g{i}", "globex", "interactive", 400, 1e9, 0.0, prompt=300) for i in range(10)]
    chat = Item("c", "acme", "interactive", 400, 1e9, 0.0, prompt=300)
    for it in [*burst, chat]:
        lanes.admit(it, 0.0)

    def pull(globex_unstarted: int) -> list[Item]:
        return lanes.select(
            free_slots=50,
            token_budget=10**9,
            total_slots=100,
            running={"interactive": 1},
            now=0.0,
            step_tokens=1000,  # two steps: 2,000 unstarted; globex's share 1,000
            prefill={"interactive": globex_unstarted},
            tenant_slots={"interactive": {"globex": 1}},
            tenant_prefill={"interactive": {"globex": globex_unstarted}},
        ).dispatch

    assert pull(600) == [burst[0], chat]  # 600 + 300 fits its 1,000; 1,200 would not
    assert pull(800) == []  # at its share: nothing more of globex's, acme has nothing waiting


def test_a_lone_tenant_keeps_every_slot_and_the_whole_cache():
    lanes = Lanes(DEFAULT_CLASSES)
    floods = [item("globex", cost=500) for _ in range(40)]
    for it in floods:
        lanes.admit(it, 0.0)
    assert _held(lanes, 0.0, 10, {"globex": 90}, {"globex": 9000}, kv=10_000) == floods[:10]
    # Another tenant's request, served, keeps it active for the window; then globex is alone again.
    lanes.admit(item("acme"), 1.0)
    assert [it.tenant for it in _held(lanes, 1.0, 10, {"globex": 85})] == ["acme", *["globex"] * 5]
    assert _held(lanes, 1.0 + ACTIVE_WINDOW_S - 0.1, 9, {"acme": 1, "globex": 90}) == []
    assert len(_held(lanes, 1.0 + ACTIVE_WINDOW_S, 9, {"acme": 1, "globex": 90})) == 9


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 64),
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 20_000),
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3000)), min_size=1, max_size=40),
)
def test_tenant_headroom_invariant(total, held_a, held_b, kv, offered):
    """Both tenants active: what each holds after a pull stays within its caps (a tenant holding
    nothing may take one item), and a pull stops short only at a cap, never with room for more."""
    lanes = Lanes(DEFAULT_CLASSES)
    policy = lanes.policy("interactive")
    for tenant in "ab":
        lanes.admit(item(tenant), 0.0)  # both active, whatever `offered` holds
    for tenant, cost in offered:
        lanes.admit(item(tenant, cost=cost), 0.0)
    held = {"a": min(held_a, total), "b": min(held_b, max(0, total - held_a))}
    tokens = {t: n * 300 for t, n in held.items()}
    free = total - sum(held.values())
    chosen = _held(lanes, 0.0, free, held, tokens, total=total, kv=kv) if free > 0 else []
    slot_cap, kv_cap = policy.tenant_slot_cap(total), policy.tenant_kv_cap(kv)
    for t in "ab":
        mine = [it for it in chosen if it.tenant == t]
        slots, cost = held[t] + len(mine), tokens[t] + sum(it.cost for it in mine)
        exempt = held[t] == 0 and len(mine) == 1
        assert not mine or exempt or slots <= slot_cap
        assert not mine or exempt or kv_cap is None or cost <= kv_cap
        rest = sorted((it for it in lanes.waiting_items() if it.tenant == t), key=lambda it: it.order)
        if rest and len(chosen) < free:
            within = slots + 1 <= slot_cap and (kv_cap is None or cost + rest[0].cost <= kv_cap)
            assert slots and not within, "a pull stopped short with room for this tenant"


def test_depths_by_class_and_tenant_count_only_what_waits():
    lanes = Lanes(DEFAULT_CLASSES)
    for tenant, klass in [("acme", "batch"), ("acme", "batch"), ("beta", "batch"), ("acme", "interactive")]:
        lanes.admit(item(tenant, klass), now=0.0)
    lanes.cancel("beta", next(i.request_id for i in lanes.waiting_items() if i.tenant == "beta"))
    take(lanes)  # the interactive one goes first
    depths = lanes.depths()
    assert depths["batch"] == {"acme": 2} and depths["interactive"] == {}
