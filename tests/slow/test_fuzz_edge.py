"""Bad input never breaks the edge: schemathesis drives ≥ 1,000 generated requests from the bridge's
own OpenAPI document (valid and invalid) against `laneway up`: no 5xx, every 4xx OpenAI-shaped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from core.ports import free_port

pytestmark = pytest.mark.slow

KEY = "sk-fuzz"
SEEN: Counter[str] = Counter()


@pytest.fixture(scope="module")
def bridge_url(tmp_path_factory) -> str:
    port = free_port()
    data = tmp_path_factory.mktemp("fuzz")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "laneway.cli",
            "--log-level",
            "WARNING",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--api-key",
            KEY,
            "--sim-profile",
            "zero",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a bound on a hang: start-up imports Presidio in the PII pool
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.25)  # kept: a sync fixture polling /readyz, the positive signal itself
    else:
        proc.kill()
        pytest.fail(f"laneway up did not become ready: {proc.stdout.read()}")
    yield url
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    print(f"\nfuzz: {sum(SEEN.values())} cases, statuses {dict(SEEN)}")


def check(case, response: requests.Response) -> None:
    SEEN[str(response.status_code)] += 1
    assert response.status_code < 500, (case.body, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]


def _operation(url: str, path: str, method: str):
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return schema[path][method]


def _clamp(case) -> None:
    # Inputs are what is under test, not generation length: keep valid streams short.
    if isinstance(case.body, dict) and isinstance(case.body.get("max_tokens"), int) and case.body["max_tokens"] > 16:
        case.body["max_tokens"] = 16
    if (
        isinstance(case.body, dict)
        and isinstance(case.body.get("max_completion_tokens"), int)
        and case.body["max_completion_tokens"] > 16
    ):
        case.body["max_completion_tokens"] = 16


@pytest.mark.parametrize("mode, examples", [(GenerationMode.POSITIVE, 500), (GenerationMode.NEGATIVE, 500)])
def test_chat_completions_fuzz(bridge_url, mode, examples):
    operation = _operation(bridge_url, "/v1/chat/completions", "POST")

    @settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        _clamp(case)
        check(case, case.call(base_url=bridge_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30))

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_batches_fuzz(bridge_url, mode):
    """Batch creation from any body: every answer a 4xx (no such input file, a bad endpoint or
    window) or a batch; never a 5xx."""
    operation = _operation(bridge_url, "/v1/batches", "POST")

    @settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        check(case, case.call(base_url=bridge_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30))

    run()


def test_models_and_auth_fuzz(bridge_url):
    operation = _operation(bridge_url, "/v1/models", "GET")

    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def run(case):
        check(case, case.call(base_url=bridge_url, timeout=30))  # no key: 401, OpenAI-shaped

    run()
    assert sum(SEEN.values()) >= 1000
