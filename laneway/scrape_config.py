"""One Prometheus scrape configuration for a `laneway up` stack, in its data dir.

`up` writes it once the ports are chosen (they are kept across a child's restarts): every
process's metrics endpoint, by the job names docker-compose and the Helm chart use, so the
Grafana board and the alert rules under deploy/ work on it as they are (`prometheus
--config.file=.laneway/prometheus.yml`). `laneway top` reads the same file to find what to scrape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

SCRAPE_FILE = "prometheus.yml"
KINDS = ("bridge", "broker", "worker")
JOB_PREFIX = "laneway-"  # laneway-bridge, laneway-broker, laneway-worker, as compose and the chart
SCRAPE_INTERVAL = "5s"  # one machine, a handful of endpoints: fresh enough to watch


@dataclass(frozen=True, slots=True)
class Target:
    kind: str  # bridge | broker | worker
    name: str  # the process's name in `up` and its log file: broker-2, worker
    address: str  # host:port of its /metrics

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"


class BadScrapeConfig(ValueError):
    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def up_targets(host: str, port: int, ports: dict[str, int]) -> list[Target]:
    """`laneway up`'s processes: the bridge's /metrics on its HTTP port, each broker's and
    worker's (`ports`, by its name: broker, worker-2) on loopback."""
    bridge_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    return [
        Target("bridge", "bridge", f"{bridge_host}:{port}"),
        *(Target(name.split("-")[0], name, f"127.0.0.1:{p}") for name, p in ports.items()),
    ]


def render(targets: list[Target]) -> str:
    jobs = []
    for kind in KINDS:
        mine = [t for t in targets if t.kind == kind]
        if mine:
            jobs.append(
                {
                    "job_name": f"{JOB_PREFIX}{kind}",
                    "static_configs": [{"targets": [t.address], "labels": {"instance": t.name}} for t in mine],
                }
            )
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "external_labels": {"stack": "laneway-up"}},
        "scrape_configs": jobs,
    }
    header = (
        "# Written by `laneway up` for this run: every process's metrics endpoint.\n"
        "# prometheus --config.file=<this file>; `laneway top` reads it too.\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False)


def write(data_dir: Path, targets: list[Target]) -> Path:
    path = data_dir / SCRAPE_FILE
    path.write_text(render(targets))
    return path


def read(path: Path) -> list[Target]:
    """The static targets of a scrape config's laneway-* jobs (a service-discovery job, as in
    compose or the chart, names no address to read here)."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BadScrapeConfig(path, str(exc)) from exc
    if not isinstance(config, dict):
        raise BadScrapeConfig(path, "not a Prometheus configuration (a mapping with scrape_configs)")
    targets = []
    for job in config.get("scrape_configs") or []:
        kind = str(job.get("job_name", "")).removeprefix(JOB_PREFIX)
        if kind not in KINDS:
            continue
        for group in job.get("static_configs") or []:
            labels = group.get("labels") or {}
            for address in group.get("targets") or []:
                targets.append(Target(kind, labels.get("instance", address), address))
    return targets
