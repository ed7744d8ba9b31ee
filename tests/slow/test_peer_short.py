"""A short run of the peer benchmark (`python -m loadtest.peer`): Laneway and LiteLLM's proxy in
front of the same mock upstream, with the pass-through floor. BEHAVIOUR only: every system
answers every request in full, and the report has its figures; never their values."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from loadtest import peer
from loadtest.results import to_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    peer.configure(parser)
    return parser.parse_args(list(argv))


def _proxy_importable(args: argparse.Namespace) -> str | None:
    env = dict(os.environ)
    if args.proxy_path.is_dir():
        env["PYTHONPATH"] = str(args.proxy_path.resolve())
    done = subprocess.run(
        [sys.executable, "-c", "import litellm.proxy.proxy_server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


async def test_peer_short():
    args = _args("--concurrency", "1", "4", "--requests", "8", "--tokens", "16")
    if (why := _proxy_importable(args)) is not None:
        pytest.skip(f"LiteLLM's proxy server cannot start here (install the peer extra): {why}")
    doc = json.loads(to_json(await peer.run_benchmark(args)))
    assert set(doc["systems"]) == {"direct", "floor", "litellm", "laneway"}
    for name, levels in doc["systems"].items():
        assert [lv["concurrency"] for lv in levels] == [1, 4]
        for lv in levels:
            assert lv["errors"] == 0, (name, lv["error_kinds"])
            assert lv["ttft"]["n"] == lv["requests"] == 8
            assert lv["requests_per_s"] > 0 and lv["cpu_ms_per_request"] >= 0
            if name != "direct":
                assert {"added_ttft_p50", "added_ttft_p99"} <= set(lv)
    assert all(doc["best_error_free_rps"][name] > 0 for name in doc["systems"])
    text = peer.render(doc)
    assert "Laneway / LiteLLM" in text and "LiteLLM proxy server" in text
