"""One scheduler, every broker a gate: SIGKILL the scheduler of `laneway up --brokers 3` while
streams run and more wait for a slot, and a standby takes over with nothing lost or doubled.

The scheduler is the broker whose id the `scheduler` key of the `sched` KV bucket holds; it is
also the one broker whose /metrics says `laneway_broker_scheduler 1` (`up --metrics` gives each
broker a port, in its command line), which is how its process is found. After the kill:
  - every accepted request completes exactly once: a full stream with its finish reason, and
    one usage record per request id on the usage stream (a second would be a second generation);
  - no client hangs (each call returns within HANG_S: a bound on a hang, not a speed);
  - another broker takes the lease.
The takeover times (kill → new lease; kill → first token of a request sent after the kill) are
printed for `pytest -s`, never asserted: speed is the benchmarks' business.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter

import aiohttp
import pytest
from nats.js.errors import BucketNotFoundError, KeyNotFoundError

from broker.scheduler.lease import LEASE_BUCKET, LEASE_KEY
from loadtest.http_client import Result, stream_chat
from loadtest.processes import LanewayUp
from schemas import codec
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the brokers"),
]

KEY = "sk-takeover"
SLOTS = 10  # batch may hold 9 (max_slot_share 0.9): one slot stays for the probe
STREAMS = 24  # batch streams: 9 run when the scheduler dies, 15 wait in the lanes
TOKENS = 300  # ~2.5 s each on the simulated H100: still running at the kill
HANG_S = 60
S = Subjects()


def body(max_tokens: int) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "a long answer, please"}],
    }


async def lease_holder(kv) -> str | None:
    try:
        entry = await kv.get(LEASE_KEY)
    except KeyNotFoundError:
        return None
    return entry.value.decode() if entry.value else None


@pytest.mark.parametrize("brokers", [2, 3])
async def test_killing_the_scheduler_loses_nothing_and_a_standby_takes_over(tmp_path, brokers):
    """With 2 brokers the survivor must also start consuming at once (the dead one was the
    scheduler: it does not count as a live peer that gates)."""
    extra = [
        "--pii",
        "off",
        "--brokers",
        str(brokers),
        "--metrics",
        "--sim-profile",
        "llama-8b-h100",
        "--sim-max-seqs",
        str(SLOTS),
    ]
    async with (
        LanewayUp(tmp_path / "lw", KEY, extra) as up,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
    ):
        nc = await up.connect_nats("ops")
        js = nc.jetstream()
        try:
            kv = await js.key_value(S.bucket(LEASE_BUCKET))
        except BucketNotFoundError:
            pytest.fail(f"no KV bucket {S.bucket(LEASE_BUCKET)}: no broker takes a scheduler lease")
        assert await eventually(lambda: lease_holder(kv)), "no broker holds the scheduler lease"
        holder = await lease_holder(kv)
        assert await eventually(lambda: _one(up.schedulers(http))), "not exactly one broker schedules"
        [victim] = await up.schedulers(http)

        results = [Result() for _ in range(STREAMS)]
        load = [
            asyncio.create_task(stream_chat(http, up.url, KEY, body(TOKENS), {"x-laneway-class": "batch"}, r))
            for r in results
        ]
        # In flight and waiting: some streams have tokens, the rest have none yet.
        assert await eventually(lambda: any(r.tokens for r in results), timeout=HANG_S)
        assert not all(r.tokens for r in results), "no request was waiting when the scheduler died"

        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        probe = Result()
        probing = asyncio.create_task(stream_chat(http, up.url, KEY, body(8), result=probe))
        assert await eventually(lambda: _other(lease_holder(kv), holder), timeout=HANG_S), (
            f"no broker took the lease from {holder}"
        )
        new_lease_s = time.monotonic() - killed
        _done, hung = await asyncio.wait([*load, probing], timeout=HANG_S)
        assert not hung, f"{len(hung)} of {STREAMS + 1} calls hung after the scheduler was killed"
        first_token = "none" if probe.ttft is None else f"{probe.ttft:.2f} s"
        print(
            f"\ntakeover ({brokers} brokers): kill → new lease {new_lease_s:.2f} s; kill → first token of a request "
            f"sent after it {first_token}"
        )

        everyone = [*results, probe]
        assert [r.error for r in everyone if not r.ok] == []
        assert all(r.finish_reason == "length" for r in everyone), Counter(r.finish_reason for r in everyone)
        assert [r.tokens for r in everyone] == [TOKENS] * STREAMS + [8]

        # Exactly once: one usage record per request id, once every id has one.
        records: Counter[str] = Counter()

        async def count(msg) -> None:
            records[codec.decode_usage(msg.data).request_id] += 1

        sub = await js.subscribe(S.usage_all, stream=S.usage_stream, cb=count, ordered_consumer=True)
        ids = {r.request_id for r in everyone}
        assert await eventually(lambda: ids <= set(records), timeout=HANG_S), ids - set(records)
        assert {i: n for i, n in records.items() if i in ids and n != 1} == {}
        await sub.unsubscribe()
        await nc.close()


async def _one(pids) -> bool:
    return len(await pids) == 1


async def _other(holder, old: str) -> bool:
    new = await holder
    return new is not None and new != old
