"""The publish refusals `bridge.publish_errors` classifies, provoked on a real nats-server:
the codes and texts it relies on are the server's, not guesses."""

from __future__ import annotations

import nats
import nats.js.errors
import pytest
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from bridge.publish_errors import PER_SUBJECT_FULL, STREAM_STORE_FAILED, refusal
from schemas.errors import ErrorCode


@pytest.fixture(scope="module")
async def js(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn.jetstream()
    await conn.close()


async def refused(js, subject: str) -> nats.js.errors.APIError:
    with pytest.raises(nats.js.errors.APIError) as info:
        await js.publish(subject, b"x" * 100)
    return info.value


async def test_a_full_subject_is_queue_full(js):
    await js.add_stream(
        StreamConfig(
            name="PERSUBJ",
            subjects=["ps.>"],
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW,
            discard_new_per_subject=True,
            max_msgs_per_subject=1,
        )
    )
    await js.publish("ps.a", b"x")
    exc = await refused(js, "ps.a")
    assert (exc.err_code, exc.description) == (STREAM_STORE_FAILED, PER_SUBJECT_FULL)
    assert refusal(exc) is ErrorCode.queue_full
    await js.publish("ps.b", b"x")  # another subject still has room


@pytest.mark.parametrize(
    ("limit", "text"), [({"max_msgs": 1}, "maximum messages exceeded"), ({"max_bytes": 150}, "maximum bytes exceeded")]
)
async def test_a_full_stream_is_overloaded(js, limit, text):
    name = "FULL" + "".join(limit).upper()
    await js.add_stream(
        StreamConfig(name=name, subjects=[f"{name}.>"], storage=StorageType.FILE, discard=DiscardPolicy.NEW, **limit)
    )
    await js.publish(f"{name}.a", b"x" * 100)
    exc = await refused(js, f"{name}.b")
    assert (exc.err_code, exc.description) == (STREAM_STORE_FAILED, text)
    assert refusal(exc) is ErrorCode.overloaded


async def test_other_api_errors_are_not_capacity_refusals(js):
    await js.add_stream(StreamConfig(name="EXPECT", subjects=["ex.>"], storage=StorageType.FILE))
    with pytest.raises(nats.js.errors.APIError) as info:
        await js.publish("ex.a", b"x", stream="NOT_THIS_ONE")
    assert info.value.err_code == 10060  # JSStreamNotMatchErr
    assert refusal(info.value) is None
