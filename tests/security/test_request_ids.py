"""A request id is the client's to choose, and an id one tenant picks or guesses gives it no hold
on another tenant's request.

Before issue 20 engines knew a running request by its id alone: a second tenant's request of the
same id was refused by the engine and handed back (it ran later, on another delivery), a
cancel that reached the engine ended whichever request held the id, and the worker's outbox,
keyed by (request_id, attempt), could merge one stream's deltas into the other's. Now engines
key by (tenant, request_id) and the outbox by the reply inbox too.
"""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from schemas import codec
from schemas.frames import Delta, Finished
from schemas.requests import Cancel
from tests.security.publisher import S, Publisher

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
async def tenants(up):
    clients = [await up.connect_nats("tenant-acme"), await up.connect_nats("tenant-globex")]
    yield [await Publisher(nc, tenant).start() for nc, tenant in zip(clients, ("acme", "globex"))]
    for nc in clients:
        await nc.close()


async def same_id(publishers: list[Publisher], max_tokens: list[int]) -> str:
    """Each publisher's request, all under one request id, published at once."""
    request_id = uuid.uuid4().hex
    await asyncio.gather(*(p.publish(msgspec.structs.replace(p.request(max_tokens=n), request_id=request_id))
                           for p, n in zip(publishers, max_tokens)))
    return request_id


def check_whole(deltas: list[Delta], end, max_tokens: int) -> None:
    """One uninterrupted answer of its own: first delivery, every seq, its own token count."""
    assert isinstance(end, Finished), end
    assert end.attempt == 1, f"refused on the engine and handed back: attempt {end.attempt}"
    assert [d.seq for d in deltas] + [end.seq] == list(range(len(deltas) + 1))
    assert end.finish_reason == "length" and end.usage.completion_tokens == max_tokens, end
    assert sum(len(d.token_ids) for d in deltas) == max_tokens, "a delta of the other stream merged in"


async def test_two_tenants_run_one_request_id_at_once_each_with_its_own_answer(tenants):
    lengths = [150, 120]
    request_id = await same_id(tenants, lengths)
    answers = await asyncio.gather(*(p.rest(request_id) for p in tenants))
    for (deltas, end), n in zip(answers, lengths):
        check_whole(deltas, end, n)


async def test_a_cancel_on_globexs_subject_leaves_acmes_request_of_that_id_running(tenants):
    acme, globex = tenants
    request_id = await same_id(tenants, [200, 400])
    firsts = await asyncio.gather(acme.next(request_id), globex.next(request_id))
    assert all(isinstance(d, Delta) and d.attempt == 1 for d in firsts), f"not both running: {firsts}"
    # globex may cancel only on its own subject: there it names acme's running request's id.
    await globex.nc.publish(S.cancel("globex", request_id),
                            codec.encode(Cancel(request_id=request_id, tenant="globex")))
    await globex.nc.flush()
    globex_end = await globex.first(request_id)
    assert isinstance(globex_end, Finished) and globex_end.finish_reason == "cancelled", globex_end
    deltas, acme_end = await acme.rest(request_id)
    check_whole([firsts[0], *deltas], acme_end, 200)
