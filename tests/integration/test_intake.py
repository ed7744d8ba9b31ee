"""The broker's pull intake, against a real nats-server: when it stops (a role switch, a
shutdown), the message being handled finishes and what the open pull already delivered goes
back at once (-NAK) for another consumer, instead of after ack_wait."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from broker.intake import PullIntake
from tests.wait import eventually

pytestmark = pytest.mark.timeout(120)

ACK_WAIT_S = 600.0      # far past the test's bounds: nothing here may come back by ack_wait
HANG_S = 60.0


async def test_a_stopped_intake_finishes_its_message_and_hands_back_the_rest(nats_server):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="INTAKE", subjects=["intake.>"]))
    await js.add_consumer("INTAKE", ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT,
                                                   ack_wait=ACK_WAIT_S))
    for i in range(5):
        await js.publish(f"intake.{i}", b"%d" % i)

    entered, release = asyncio.Event(), asyncio.Event()
    first: list[bytes] = []

    async def blocking(msg: Msg) -> None:          # nats-py runs callbacks one at a time
        first.append(msg.data)
        entered.set()
        await release.wait()
        await msg.ack()

    stopping = PullIntake(nc, "INTAKE", "d", blocking, room=lambda: 5)
    await stopping.start()
    try:
        await asyncio.wait_for(entered.wait(), HANG_S)
        stop = asyncio.create_task(stopping.stop())
        await asyncio.sleep(0)                      # stop() has begun (its first step) before the handler ends
        release.set()
        await asyncio.wait_for(stop, HANG_S)
        assert first == [b"0"]                      # handled once, and to its end (acked)

        taken: list[bytes] = []

        async def taking(msg: Msg) -> None:
            taken.append(msg.data)
            await msg.ack()

        other = PullIntake(nc, "INTAKE", "d", taking, room=lambda: 5)
        await other.start()
        try:
            assert await eventually(lambda: len(taken) == 4, timeout=HANG_S), taken
            assert sorted(taken) == [b"1", b"2", b"3", b"4"]
        finally:
            await other.stop()
    finally:
        await nc.close()
