"""`laneway up` writes one scrape config that covers the whole stack, and `laneway top` reads it.

Issue 37: the bridge's /metrics alone was known, and 18 of the 20 names the Grafana board uses
are the broker's and workers'. Here a real `laneway up` runs, a little traffic goes through it,
every target of the scrape config it wrote is scraped, and every metric name the dashboard and
the alert rules use must be served by some process; then `laneway top --once` shows the class,
the tenant, the refusal and the worker of that traffic.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest.processes import LanewayUp
from tests.unit.test_deploy_stack import _SUFFIXES as SUFFIXES
from tests.unit.test_deploy_stack import dashboard_exprs, promql_metrics, rule_exprs
from tests.wait import eventually

KEY = "sk-up-metrics"
# What the traffic below must have put a sample into, not only declared (each process's own).
SAMPLED = (
    "laneway_ttft_seconds_bucket",
    "laneway_http_requests_total",
    "laneway_queue_wait_seconds_bucket",
    "laneway_queue_depth",
    "laneway_ready_workers",
    "laneway_usage_tokens_total",
    "laneway_usage_cost_usd_total",
    "laneway_worker_slots_in_use",
    "laneway_worker_tokens_total",
    "laneway_worker_prompt_tokens_total",
)

pytestmark = pytest.mark.timeout(600)


def names_used() -> set[str]:
    """Every metric name in the board's queries and the alert rules' expressions (not the
    recording rules' own names, which Prometheus makes)."""
    return {name for _, expr in dashboard_exprs() + rule_exprs() for name in promql_metrics(expr) if ":" not in name}


def served(text: str) -> tuple[set[str], set[str]]:
    """(every sample name a scrape declares, those it has a sample of)."""
    declared, sampled = set(), set()
    for family in text_string_to_metric_families(text):
        declared.update(family.name + suffix for suffix in SUFFIXES[family.type])
        sampled.update(s.name for s in family.samples)
    return declared, sampled


def scrape_targets(data_dir: Path) -> dict[str, list[str]]:
    """job name → the addresses of the scrape config `up` wrote into its data dir."""
    config = yaml.safe_load((data_dir / "prometheus.yml").read_text())
    return {
        job["job_name"]: [a for group in job["static_configs"] for a in group["targets"]]
        for job in config["scrape_configs"]
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    extra = ["--pii", "off", "--workers", "2", "--sim-profile", "llama-8b-h100"]
    async with LanewayUp(tmp_path_factory.mktemp("metrics") / "lw", KEY, extra) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key=KEY, max_retries=0)
        for stream in (True, False):
            reply = await client.chat.completions.create(
                model="laneway-sim", stream=stream, max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
            if stream:
                assert [c async for c in reply]
        with pytest.raises(openai.NotFoundError):  # a refusal, counted for the tenant's class
            await client.chat.completions.create(
                model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
        await client.close()
        yield running


async def test_the_scrape_config_covers_every_process_and_every_name_the_board_uses(up):
    assert str(up.data_dir / "prometheus.yml") in up.banner  # `up` says where it is
    targets = scrape_targets(up.data_dir)
    assert {job: len(addresses) for job, addresses in targets.items()} == {
        "laneway-bridge": 1,
        "laneway-broker": 1,
        "laneway-worker": 2,
    }, targets
    used = names_used()
    assert len(used) >= 20 and "laneway_queue_depth" in used, used

    async def scrape() -> dict[str, tuple[set[str], set[str]]]:
        async with aiohttp.ClientSession() as http:
            out = {}
            for job, addresses in targets.items():
                for address in addresses:
                    async with http.get(f"http://{address}/metrics") as resp:
                        assert resp.status == 200, (job, address)
                        out[f"{job} {address}"] = served(await resp.text())
            return out

    scraped: dict[str, tuple[set[str], set[str]]] = {}

    async def metered() -> bool:  # usage is metered from the usage records, a moment later
        scraped.update(await scrape())
        return all(any(name in sampled for _, sampled in scraped.values()) for name in SAMPLED)

    assert await eventually(metered), {name for name in SAMPLED if not any(name in s for _, s in scraped.values())}
    declared = set().union(*(d for d, _ in scraped.values()))
    assert used - declared == set(), f"the board or the alerts use names no process serves: {used - declared}"


def _row(text: str, *cells: str) -> list[str]:
    return [line for line in text.splitlines() if line.split()[: len(cells)] == list(cells)]


async def test_top_once_shows_the_class_the_tenant_and_the_workers(up):
    top = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        "top",
        "--once",
        "--data-dir",
        str(up.data_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(top.communicate(), 60)
    text = out.decode()
    assert top.returncode == 0, err.decode()
    assert _row(text, "interactive", "(all)"), text
    demo = _row(text, "demo")  # the tenant's row under its class
    assert len(demo) == 1, text
    assert demo[0].split()[-1] == "1", text  # its refusal (model not found)
    assert _row(text, "worker-1", "sim") and _row(text, "worker-2", "sim"), text
    assert _row(text, "bridge", up.url.removeprefix("http://")), text
    assert "not answering" not in text, text
