"""The broker's pull intake on a real nats-server: stopping it (a role switch, a shutdown) loses
no message to `ack_wait`. What its open pull delivered is still handed on; what arrives after goes
to the next puller at once."""

from __future__ import annotations

import asyncio

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from broker.intake import PullIntake
from tests.wait import eventually

ACK_WAIT_S = 60.0  # far past any wait below: a message parked until it lapses fails the test


async def test_stopping_hands_on_what_the_open_pull_delivered_and_leaves_the_rest_to_others(nats_server):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="INTAKE", subjects=["intake.>"])
    await js.add_consumer(
        "INTAKE", ConsumerConfig(durable_name="brokers", ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S)
    )
    handled: list[bytes] = []
    release = asyncio.Event()

    async def on_message(msg) -> None:
        handled.append(msg.data)
        await release.wait()  # the first message holds the callback: the rest queue up behind it
        await msg.ack()

    intake = PullIntake(nc, "INTAKE", "brokers", on_message, room=lambda: 100)
    try:
        await intake.start()
        for i in range(5):
            await js.publish("intake.x", b"before-%d" % i)

        async def consumer(num_ack_pending: int, num_waiting: int) -> bool:
            info = await js.consumer_info("INTAKE", "brokers")
            return (info.num_ack_pending, info.num_waiting) == (num_ack_pending, num_waiting)

        assert await eventually(lambda: consumer(5, 1))  # all delivered; the pull still open
        assert await eventually(lambda: handled == [b"before-0"])

        # The server forgets the pull once the UNSUB lands, while the first message still holds
        # the callback: the four behind it are in this client's hands now.
        stopping = asyncio.create_task(intake.stop())
        assert await eventually(lambda: consumer(5, 0))
        release.set()
        await asyncio.wait_for(stopping, 30)
        assert handled == [b"before-%d" % i for i in range(5)]

        for i in range(3):
            await js.publish("intake.x", b"after-%d" % i)
        other = await js.pull_subscribe_bind("brokers", "INTAKE")
        got = await other.fetch(3, timeout=30)
        assert [m.data for m in got] == [b"after-%d" % i for i in range(3)]
        assert handled == [b"before-%d" % i for i in range(5)]
    finally:
        release.set()  # else a failed assert above would leave stop() draining forever
        await intake.stop()
        await nc.close()
