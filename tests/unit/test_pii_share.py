"""A tenant's bounded share of the PII stage: the pool's processes its jobs hold at once
(`broker/share.py`, and the engine that holds a unit per job until the job ends), and
the most text of one request the stage analyses.

Before, the analyzer pool was one FIFO queue for everybody: a tenant sending many large prompts
had every process busy and every other tenant's analysis queued behind its flood, and a text of
any size was analysed. Only asyncio runs here: the pool is a stand-in whose jobs end when the
test says, since no real process can be held mid-job.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from broker.gate.pii import PiiGate, PiiTooLarge, PiiUnavailable, TenantPiiPolicy
from broker.gate.pipeline import Gate
from broker.pii_analysis.plan import plan_for
from broker.pii_analysis.pool import PiiEngine
from broker.share import TenantShare, default_share
from core.policy.refusal import Refusal
from core.policy.tenants import Tenant
from schemas.errors import ErrorCode
from schemas.openai import ChatBody, FunctionDef, Message, Tool
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects
from tests.requests import chat


async def turns_until(holds) -> None:
    """One loop turn at a time until `holds()`: the tasks under test get to run, nothing else."""
    for _ in range(1000):
        if holds():
            return
        await asyncio.sleep(0)  # scenario, kept: one loop turn, so the takers run
    raise AssertionError("the tasks never got there")


# -- the share: pure ------------------------------------------------------------------------
def test_half_the_pool_rounded_up_so_one_tenant_never_holds_every_process():
    assert [default_share(n) for n in (1, 2, 3, 4, 8)] == [1, 1, 2, 2, 4]
    assert all(default_share(n) < n for n in range(2, 65))
    with pytest.raises(ValueError):
        TenantShare(0)


async def test_a_flooding_tenant_holds_at_most_its_share_and_the_rest_wait_in_order():
    share = TenantShare(2)
    order: list[int] = []

    async def analysis(i: int) -> None:
        await share.take("flood")
        order.append(i)

    tasks = [asyncio.create_task(analysis(i)) for i in range(10)]
    await turns_until(lambda: share.waiting("flood") == 8)
    assert order == [0, 1] and share.held("flood") == 2
    for expected in ([0, 1, 2], [0, 1, 2, 3]):
        share.give_back("flood")
        await turns_until(lambda e=expected: len(order) == len(e))
        assert order == expected and share.held("flood") == 2
    share.give_back("flood", 6)
    await asyncio.gather(*tasks)
    assert order == list(range(10)) and share.held("flood") == 2 and share.waiting("flood") == 0


async def test_another_tenant_starts_while_the_flood_waits():
    share = TenantShare(1)
    assert await share.take("flood") == 1
    flood = [asyncio.create_task(share.take("flood")) for _ in range(5)]
    await turns_until(lambda: share.waiting("flood") == 5)
    assert await share.take("quiet") == 1  # no wait behind the flood
    assert share.waiting("flood") == 5 and not any(t.done() for t in flood)
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_a_caller_takes_more_units_only_while_nobody_of_its_tenant_waits():
    share = TenantShare(3)
    assert await share.take("t", want=5) == 3  # never past the share
    waiters = [asyncio.create_task(share.take("t", want=3)) for _ in range(2)]
    await turns_until(lambda: share.waiting("t") == 2)
    share.give_back("t", 2)  # one to each waiter, in order: none left over
    assert [await w for w in waiters] == [1, 1]
    share.give_back("t", 3)
    assert share.held("t") == 0
    assert await share.take("t", want=2) == 2
    waiter = asyncio.create_task(share.take("t", want=3))
    assert await waiter == 1  # the one unit still free
    share.give_back("t", 3)
    assert await share.take("t", want=3) == 3


async def test_a_cancelled_waiter_takes_nothing_and_gives_back_nothing():
    share = TenantShare(1)
    await share.take("t")
    first, second = asyncio.create_task(share.take("t")), asyncio.create_task(share.take("t"))
    await turns_until(lambda: share.waiting("t") == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert share.held("t") == 1 and share.waiting("t") == 1
    share.give_back("t")  # the unit skips the cancelled waiter
    assert await second == 1 and share.held("t") == 1
    share.give_back("t")
    assert share.held("t") == 0
    with pytest.raises(RuntimeError):
        share.give_back("t")  # nobody may free what nobody holds


async def test_a_waiter_cancelled_after_its_unit_was_handed_over_passes_it_on():
    share = TenantShare(1)
    await share.take("t")
    first, second = asyncio.create_task(share.take("t")), asyncio.create_task(share.take("t"))
    await turns_until(lambda: share.waiting("t") == 2)
    share.give_back("t")  # handed to `first`, which has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await turns_until(second.done)  # kept by `first`, the unit would be lost
    assert second.result() == 1 and share.held("t") == 1 and share.waiting("t") == 0


async def test_a_wait_bounded_by_a_timeout_leaves_the_share_as_it_was():
    share = TenantShare(1)
    await share.take("t")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await share.take("t")
    assert share.held("t") == 1 and share.waiting("t") == 0


# -- the engine: a unit per job, held until the job ends --------------------------------------
class Pool:
    """Stands in for the process pool: each job runs until the test ends it."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, int]] = []

    def submit(self, fn, plan, pieces) -> Future:
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        self.jobs.append((fut, len(pieces)))
        return fut

    def end(self, i: int) -> None:
        fut, pieces = self.jobs[i]
        fut.set_result(([[] for _ in range(pieces)], 0.0))


@pytest.fixture
def engine() -> PiiEngine:
    engine = PiiEngine(workers=2, ner_model=None)  # a share of 1
    engine._pool = Pool()
    return engine


PLAN = plan_for(TenantPiiPolicy())


async def test_a_flood_keeps_one_job_in_the_pool_and_another_tenant_gets_in(engine):
    pool = engine._pool
    flood = [asyncio.create_task(engine.analyze("flood", PLAN, [f"text {i}"], 30)) for i in range(4)]
    await turns_until(lambda: engine.share.waiting("flood") == 3)
    quiet = asyncio.create_task(engine.analyze("quiet", PLAN, ["hello"], 30))
    await turns_until(lambda: len(pool.jobs) == 2)
    assert not quiet.done()
    pool.end(1)  # the quiet tenant's job, submitted while the flood waits
    assert (await quiet)[0] == [[]]
    assert len(pool.jobs) == 2 and engine.share.waiting("flood") == 3
    for job, submitted in ((0, 3), (2, 4), (3, 5), (4, 5)):  # each flood job ends; the next goes in
        pool.end(job)
        await turns_until(lambda n=submitted: len(pool.jobs) == n)
        assert engine.share.held("flood") <= 1
    await asyncio.gather(*flood)
    assert engine.share.held("flood") == 0


async def test_a_long_text_is_cut_into_no_more_jobs_than_the_share(engine):
    pool = engine._pool
    long = ("word " * 2000).strip()  # 10,000 characters: enough for both processes
    task = asyncio.create_task(engine.analyze("t", PLAN, [long], 30))
    await turns_until(lambda: pool.jobs)
    assert len(pool.jobs) == 1 and engine.share.held("t") == 1
    pool.end(0)
    await task


async def test_a_caller_that_stops_waiting_leaves_its_job_holding_the_unit(engine):
    """Its job still runs in a process: freeing the unit then would let a tenant whose analyses
    always time out fill the pool with them."""
    pool = engine._pool
    with pytest.raises(PiiUnavailable, match="exceeded"):
        await engine.analyze("t", PLAN, ["slow"], 0.01)
    assert len(pool.jobs) == 1 and engine.share.held("t") == 1
    with pytest.raises(PiiUnavailable, match="waiting behind this tenant's own analyses"):
        await engine.analyze("t", PLAN, ["next"], 0.01)
    assert len(pool.jobs) == 1
    pool.end(0)
    await turns_until(lambda: engine.share.held("t") == 0)
    nxt = asyncio.create_task(engine.analyze("t", PLAN, ["next"], 30))
    await turns_until(lambda: len(pool.jobs) == 2)
    pool.end(1)
    await nxt


async def test_a_cancelled_caller_waiting_for_its_share_takes_no_unit(engine):
    pool = engine._pool
    first = asyncio.create_task(engine.analyze("t", PLAN, ["one"], 30))
    waiting = asyncio.create_task(engine.analyze("t", PLAN, ["two"], 30))
    await turns_until(lambda: engine.share.waiting("t") == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    pool.end(0)
    await first
    await turns_until(lambda: engine.share.held("t") == 0)
    assert len(pool.jobs) == 1


# -- the size limit ---------------------------------------------------------------------------
def gate(max_chars: int) -> PiiGate:
    """Never started: a request that reached analysis would fail with `PiiUnavailable`."""
    return PiiGate(workers=1, ner_model=None, max_chars=max_chars)


async def test_text_over_the_limit_is_refused_before_any_analysis():
    body = chat("x" * 60, tools=[Tool(function=FunctionDef(name="f", description="d" * 41))])
    with pytest.raises(PiiTooLarge) as refused:
        await gate(100).inspect_body("t", TenantPiiPolicy(), body)
    assert (refused.value.chars, refused.value.limit, refused.value.param) == (102, 100, "messages")
    with pytest.raises(PiiUnavailable, match="not running"):  # at the limit: on to analysis
        await gate(102).inspect_body("t", TenantPiiPolicy(), body)
    assert (await gate(100).inspect_body("t", TenantPiiPolicy(enabled=False), body)).action == "pass"


async def test_the_refusal_names_the_field_with_the_most_text():
    body = ChatBody(
        model="m", messages=[Message("user", "hi")], tools=[Tool(function=FunctionDef(name="f", description="d" * 200))]
    )
    with pytest.raises(PiiTooLarge) as refused:
        await gate(100).inspect_body("t", TenantPiiPolicy(), body)
    assert refused.value.param == "tools" and "at most 100" in str(refused.value)


async def test_the_gate_refuses_it_as_pii_too_large():
    request = GenerateRequest(
        request_id="r1",
        tenant="t",
        klass="interactive",
        model="m",
        reply_to="lw.tok.t.e",
        created_at=0.0,
        deadline=1.0,
        chat=chat("x" * 11),
    )
    g = Gate(Subjects("lw"))
    g.use_pii(gate(10), publish_audit=None)
    with pytest.raises(Refusal) as refused:
        await g._pii(request, "t", Tenant(name="t"))
    assert refused.value.code is ErrorCode.pii_too_large and refused.value.param == "messages"


async def test_a_tenants_waiting_jobs_go_by_class_rank_then_arrival() -> None:
    """A tenant's chat queued behind its own batch flood for the analyzer pool is the next job
    through: the pool's door keeps the lanes' order (a lower rank first)."""
    share = TenantShare(1)
    assert await share.take("acme", rank=2) == 1  # a batch job holds the one unit
    order: list[str] = []

    async def job(name: str, rank: int) -> None:
        await share.take("acme", rank=rank)
        order.append(name)

    tasks = [asyncio.create_task(job(f"batch{i}", 2)) for i in range(5)]
    tasks.append(asyncio.create_task(job("chat", 0)))
    while share.waiting("acme") < 6:
        await asyncio.sleep(0)
    for done in range(1, 7):  # each unit given back goes to the first waiter by rank
        share.give_back("acme")
        while len(order) < done:
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order[0] == "chat" and order[1:] == [f"batch{i}" for i in range(5)]
