"""The sim's vLLM-V1-like scheduler, driven step by step without an event loop."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.openai import CompletionBody
from workers.engine import EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.engines.sim.scheduler import BLOCK, Scheduler, SchedulerConfig, Sequence, Step, block_hashes

_arrivals = itertools.count()


def seq(prompt: int, priority: int = 0, text: str | None = None, salt: str = "") -> Sequence:
    n = next(_arrivals)
    body = text if text is not None else f"{n:08d}" * (prompt // 2 + 1)  # distinct per sequence
    return Sequence(n, priority, n, prompt, block_hashes(body, prompt, salt))


def run(s: Scheduler, steps: int = 1, end_after: dict[Sequence, int] | None = None):
    """Run steps; a sequence in `end_after` finishes once it has sampled that many tokens."""
    out = []
    for _ in range(steps):
        step = s.schedule()
        out.append(step)
        for done in s.finish_step(step):
            if end_after and done.num_tokens - done.prompt_tokens >= end_after.get(done, 1 << 30):
                s.finish(done)
    return out


def test_a_long_prompt_is_prefilled_in_chunks_of_the_budget():
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, num_blocks=1000))
    long = seq(5000)
    s.add(long)
    steps = run(s, 3)
    assert [st.scheduled[long] for st in steps] == [2048, 2048, 904]
    assert long.num_tokens == 5001  # one token sampled, after the last chunk only
    assert run(s)[0].scheduled[long] == 1  # then it decodes


def test_running_decodes_go_before_a_waiting_prefill_and_it_takes_what_is_left():
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, num_blocks=1000))
    chats = [seq(100) for _ in range(3)]
    for c in chats:
        s.add(c)
    run(s)  # all three prefilled in one step (300 ≤ 512)
    big = seq(4000)
    s.add(big)
    step = run(s)[0]
    assert [step.scheduled[c] for c in chats] == [1, 1, 1]
    assert step.decodes == 3
    assert step.scheduled[big] == 512 - 3
    assert list(step.scheduled)[:3] == chats  # served first, in the order they started


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 2), st.integers(1, 40)), min_size=1, max_size=30),
    st.integers(16, 1024),
    st.integers(1, 6),
    st.sampled_from([0, 64]),
)
def test_every_step_keeps_its_budget_slots_and_kv(work, budget, max_seqs, threshold):
    blocks = 4000 // BLOCK
    s = Scheduler(
        SchedulerConfig(
            max_num_seqs=max_seqs,
            max_num_batched_tokens=budget,
            num_blocks=blocks,
            long_prefill_token_threshold=threshold,
        )
    )
    outputs = {}
    for prompt, priority, out in work:
        q = seq(min(prompt, 4000 - out - 1), priority)
        outputs[q] = out
        s.add(q)
    for _ in range(5000):
        if not s.has_work():
            break
        step = s.schedule()
        assert step.tokens <= budget
        assert len(s.running) <= max_seqs
        assert s.pool.free >= 0 and sum(len(q.blocks) for q in s.running) <= blocks
        if threshold and len(step.scheduled) > 1:
            assert max(step.scheduled.values()) <= threshold
        assert step.scheduled or step.preempted
        for done in s.finish_step(step):
            if done.num_tokens - done.prompt_tokens >= outputs[done]:
                s.finish(done)
    assert not s.has_work()  # every sequence ran to its end
    assert s.pool.free == blocks  # and gave all its blocks back


def test_out_of_kv_the_lowest_priority_running_sequence_is_preempted_for_a_higher_one():
    # 12 blocks: two low-priority prompts of 5 blocks each hold 10; a chat's prompt takes the last 2.
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4096, num_blocks=12))
    old, young = seq(5 * BLOCK - 1, priority=2), seq(5 * BLOCK - 1, priority=2)
    s.add(old)
    s.add(young)
    run(s)  # both prefilled: each sampled its first token
    chat = seq(2 * BLOCK - 1, priority=0)
    s.add(chat)
    run(s)
    assert chat in s.running and s.pool.free == 0
    step = run(s)[0]  # `old` crosses a block boundary: no block is free
    assert step.preempted == [young]  # the latest arrival of the lowest priority
    assert chat in step.scheduled and old in step.scheduled and young not in s.running
    assert young.computed == 0 and young.blocks == [] and young.preemptions == 1
    s.finish(chat)
    s.finish(old)
    resumed = young.num_tokens
    scheduled = run(s)[0].scheduled[young]  # recomputed: its prompt and its output so far, less
    assert young.cached_tokens == 4 * BLOCK  # its own full prompt blocks, freed but still cached
    assert scheduled == resumed - young.cached_tokens
    assert young.num_tokens == resumed + 1


def test_fcfs_preempts_the_last_started():
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4096, num_blocks=8, policy="fcfs"))
    first, second = seq(4 * BLOCK - 1, priority=5), seq(4 * BLOCK - 1, priority=0)
    s.add(first)
    s.add(second)
    steps = run(s, 3)  # step 3: `first` needs a fifth block
    assert [q for st in steps for q in st.preempted] == [second]


def test_a_shared_prefix_is_prefilled_once_and_the_last_token_always_computed():
    system = "You are a helpful assistant for Acme invoices. " * 60  # ~700 tokens
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192, num_blocks=1000))
    a = seq(len(system + "first question") // 4, text=system + "first question")
    s.add(a)
    first = run(s)[0].scheduled[a]
    s.finish(a)  # it ends; its blocks stay cached
    b = seq(len(system + "second question") // 4, text=system + "second question")
    s.add(b)
    second = run(s)[0].scheduled[b]
    assert first == a.prompt_tokens
    assert second < first // 4 and b.cached_tokens == b.prompt_tokens - second
    same = seq(b.prompt_tokens, text=system + "second question")
    s.add(same)
    assert run(s)[0].scheduled[same] >= 1  # a whole hit still computes its last token


def test_the_cache_salt_separates_tenants():
    text = "shared system prompt " * 100
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192, num_blocks=1000))
    a, b = seq(len(text) // 4, text=text, salt="tenant-a"), seq(len(text) // 4, text=text, salt="tenant-b")
    s.add(a)
    run(s)
    s.add(b)
    run(s)
    assert b.cached_tokens == 0


def test_cached_blocks_are_evicted_least_recently_used_first_within_the_kv_size():
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192, num_blocks=20))
    keep = "kept prefix " * 60  # 180 tokens: 11 full blocks
    a = seq(len(keep) // 4, text=keep)
    s.add(a)
    run(s)
    s.finish(a)
    assert s.pool.free == 20  # cached blocks are free blocks
    filler = seq(15 * BLOCK)  # 8 never-used blocks, then 7 from the LRU head
    s.add(filler)
    run(s)
    s.finish(filler)
    again = seq(len(keep) // 4, text=keep)
    s.add(again)
    run(s)
    assert 0 < again.cached_tokens < a.prompt_tokens - BLOCK


def test_an_aborted_waiting_sequence_leaves_no_work():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=512, num_blocks=100))
    a, b = seq(100), seq(100)
    s.add(a)
    s.add(b)
    run(s)
    s.finish(b)  # never started
    s.finish(a)
    assert not s.has_work() and s.pool.free == 100


# -- through the engine -------------------------------------------------------------------
async def test_the_sim_engine_prefills_a_long_prompt_over_budgeted_steps():
    engine = SimEngine(PROFILES["zero"], max_num_batched_tokens=512)
    await engine.start()
    try:
        body = CompletionBody(model="m", prompt="word " * 1600, max_tokens=2)  # 2,000 tokens
        stream = engine.generate(EngineRequest("long", body))
        first = await anext(stream)
        assert first.token_ids and engine.steps == 4  # 512 + 512 + 512 + 464
        async for out in stream:
            if out.finish_reason is not None:
                assert out.prompt_tokens == 2000
    finally:
        await engine.cleanup()


def test_a_step_lasts_its_roofline_the_longer_of_memory_and_compute():
    engine = SimEngine(PROFILES["llama-8b-h100"])
    p = PROFILES["llama-8b-h100"]
    a, b = seq(100), seq(100)
    a.computed = b.computed = 100  # both decoding, 100 tokens of context each
    decode, chunk, two = Step({a: 1}, decodes=1), Step({a: 2048}), Step({a: 1, b: 1}, decodes=2)
    assert engine.step_time(decode) < engine.step_time(two) < engine.step_time(chunk)
    # Memory-bound: the weights once plus each sequence's KV cache, as long as its context.
    assert engine.step_time(two) == pytest.approx(p.decode_base_s + 2 * 101 * p.kv_s_per_token)
    # Compute-bound: a 2,048-token chunk's FLOPs outlast the reads.
    assert engine.step_time(chunk) == pytest.approx(2048 * p.prefill_s_per_token)
    # A small chunk packed into a decode step rides under its memory time, as in vLLM.
    knee = int(engine.step_time(two) / p.prefill_s_per_token) - 1
    fresh = seq(knee)
    mixed = Step({a: 1, fresh: knee}, decodes=1)
    assert engine.step_time(mixed) == pytest.approx(p.decode_base_s + (101 + knee) * p.kv_s_per_token)
    assert engine.step_time(Step({a: 1, fresh: 2 * knee}, decodes=1)) == pytest.approx(
        (1 + 2 * knee) * p.prefill_s_per_token
    )
    # Every token the step processes costs FLOPs, the decodes' too.
    assert engine.step_time(Step({a: 1, b: 1000}, decodes=1)) == pytest.approx(1001 * p.prefill_s_per_token)


def test_a_long_conversation_makes_a_longer_decode_step_than_a_short_one():
    """Each sequence's KV read is its context (PagedAttention reads every block of it): 200
    decodes of short chats make a shorter step than 200 of the reference documents' 1.9K."""
    engine = SimEngine(PROFILES["llama-8b-h100"])
    p = PROFILES["llama-8b-h100"]
    short, long = [seq(64) for _ in range(200)], [seq(1900) for _ in range(200)]
    for s in short:
        s.computed = 64
    for s in long:
        s.computed = 1899
    short_step = engine.step_time(Step(dict.fromkeys(short, 1), decodes=200))
    long_step = engine.step_time(Step(dict.fromkeys(long, 1), decodes=200))
    assert long_step == pytest.approx(p.decode_base_s + 200 * p.decode_s_per_seq)
    assert short_step == pytest.approx(p.decode_base_s + 200 * 65 * p.kv_s_per_token)
    assert short_step < long_step
