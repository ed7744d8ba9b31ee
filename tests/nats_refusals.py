"""A generated NATS user (a tenant's, ops) attacking Laneway's state directly, with the server as
the witness: each attempt must be refused by nats-server itself (a violation logged for that user
and subject), not merely go unanswered; and what a user may read, read whole, message by message."""

from __future__ import annotations

from pathlib import Path

import nats.errors
import nats.js.errors
import pytest

from loadtest.processes import LanewayUp


async def every_message(js, stream: str) -> list[bytes]:
    """Every message the stream still holds, not only the latest revision of each subject."""
    info = await js.stream_info(stream)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            found.append((await js.get_msg(stream, seq)).data)
        except nats.js.errors.NotFoundError:
            pass  # a later revision of its key replaced it
    return found


def violations(data_dir: Path, who: str) -> list[str]:
    """The server's permission violations for users whose name contains `who`."""
    log = (data_dir / "nats" / "nats-server.log").read_text()
    return [line for line in log.splitlines() if who in line and "violation" in line.lower()]


async def assert_refused(up: LanewayUp, user: str, requests: tuple[str, ...], subscription: str) -> None:
    """`user` asks each of `requests` (JetStream APIs, bucket subjects) and subscribes to
    `subscription`: every one refused, and logged as refused."""
    nc = await up.connect_nats(user)
    try:
        for subject in requests:
            with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.errors.Error)):
                await nc.request(subject, b"", timeout=2)
        with pytest.raises(nats.errors.Error):
            sub = await nc.subscribe(subscription)
            await nc.flush()
            await sub.next_msg(timeout=1)
    finally:
        await nc.close()
    refused = violations(up.data_dir, user)
    assert all(any(f'"{subject}"' in line for line in refused) for subject in requests)
    assert any("Subscription Violation" in line and subscription in line for line in refused)
