"""A request id is the client's to choose, and an id one tenant picks or guesses gives it no hold
on another tenant's request.

Before issue 20 engines knew a running request by its id alone: a second tenant's request of the
same id was refused by the engine and handed back (it ran later, on another delivery), a
cancel that reached the engine ended whichever request held the id, and the worker's outbox,
keyed by (request_id, attempt), could merge one stream's deltas into the other's. An
`Idempotency-Key`'s id was sha256(tenant NUL key), which anyone who knows or guesses the key
can compute. Now engines key by (tenant, request_id), the outbox by the reply inbox too, and
the id is an HMAC under the bridges' shared secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import msgspec
import openai
import pytest

from schemas import codec
from schemas.frames import Delta, Finished
from schemas.requests import Cancel
from tests.security.conftest import KEYS
from tests.security.publisher import Publisher, S

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
async def tenants(up):
    clients = [await up.connect_nats("tenant-acme"), await up.connect_nats("tenant-globex")]
    yield [await Publisher(nc, tenant).start() for nc, tenant in zip(clients, ("acme", "globex"), strict=True)]
    for nc in clients:
        await nc.close()


async def same_id(publishers: list[Publisher], max_tokens: list[int]) -> str:
    """Each publisher's request, all under one request id, published at once."""
    request_id = uuid.uuid4().hex
    await asyncio.gather(
        *(
            p.publish(msgspec.structs.replace(p.request(max_tokens=n), request_id=request_id))
            for p, n in zip(publishers, max_tokens, strict=True)
        )
    )
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
    for (deltas, end), n in zip(answers, lengths, strict=True):
        check_whole(deltas, end, n)


async def test_a_cancel_on_globexs_subject_leaves_acmes_request_of_that_id_running(tenants):
    acme, globex = tenants
    request_id = await same_id(tenants, [200, 400])
    firsts = await asyncio.gather(acme.next(request_id), globex.next(request_id))
    assert all(isinstance(d, Delta) and d.attempt == 1 for d in firsts), f"not both running: {firsts}"
    # globex may cancel only on its own subject: there it names acme's running request's id.
    await globex.nc.publish(
        S.cancel("globex", request_id), codec.encode(Cancel(request_id=request_id, tenant="globex"))
    )
    await globex.nc.flush()
    globex_end = await globex.first(request_id)
    assert isinstance(globex_end, Finished) and globex_end.finish_reason == "cancelled", globex_end
    deltas, acme_end = await acme.rest(request_id)
    check_whole([firsts[0], *deltas], acme_end, 200)


async def test_an_idempotency_keys_request_id_is_keyed_by_the_bridges_secret(up):
    ids = {}
    for tenant in ("acme", "globex"):
        async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEYS[tenant], max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="laneway-sim",
                max_tokens=4,
                messages=[{"role": "user", "content": "hello"}],
                extra_headers={"Idempotency-Key": "k1"},
            )
            request_id = raw.parse().id.removeprefix("chatcmpl-")
            unkeyed = hashlib.sha256(f"{tenant}\0k1".encode()).hexdigest()[:32]
            assert request_id != unkeyed, "the id is computable from the tenant and its key alone"
            assert raw.headers["x-request-id"] == request_id
            ids[tenant] = request_id
            # The same key again maps to the same id: stored once, the retry is told so.
            with pytest.raises(openai.ConflictError):
                await client.chat.completions.create(
                    model="laneway-sim",
                    max_tokens=4,
                    messages=[{"role": "user", "content": "hello"}],
                    extra_headers={"Idempotency-Key": "k1"},
                )
    assert ids["acme"] != ids["globex"]


@pytest.mark.parametrize("key", ["", "k" * 256])
async def test_an_idempotency_key_outside_1_to_255_characters_is_refused(up, key):
    async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEYS["acme"], max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="laneway-sim",
                max_tokens=4,
                messages=[{"role": "user", "content": "hello"}],
                extra_headers={"Idempotency-Key": key},
            )
    assert refused.value.body["param"] == "Idempotency-Key"
