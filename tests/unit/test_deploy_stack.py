"""The deployable stack (docker-compose.yml, deploy/) agrees with the code it deploys.

No Docker engine runs here, so nothing is started. The checks:
- the compose file validates (`docker-compose config -q`; skipped without a compose binary);
- every Laneway service runs a real `laneway` subcommand with flags that subcommand has, and its
  command line parses; pools, GPUs, NATS nodes and the settings file are consistent; a one-shot
  `laneway ops provision` runs before every service;
- every Prometheus scrape target is a compose service on a port that service exposes and listens on,
  and each kind of process is scraped under the job `laneway up`'s scrape config gives it;
- every metric named in the Grafana dashboard and the alert rules is exported by a `*Metrics`
  class of Laneway (or is a recording rule defined in the rules file);
- promtool accepts the Prometheus config, the rules and every dashboard query (skipped without it).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from laneway.scrape_config import JOB_PREFIX, KINDS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "laneway.json"
SETTINGS = DEPLOY / "settings.toml"
PLACEHOLDER_KEY = "lw-demo-key-CHANGE-ME"  # documented in deploy/settings.toml
ROLES = ("broker", "worker", "bridge")
PROVISION = ["ops", "provision"]  # the one-shot service's subcommand
METRICS_PACKAGES = ("core", "bridge", "broker", "workers", "laneway", "loadtest")


# -- helpers ----------------------------------------------------------------------------------
@functools.cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with every variable unset: what a fresh checkout runs."""
    return _VAR.sub(lambda m: m.group(2) or "", value).replace("$$", "$")


def laneway_services() -> dict[str, list[str]]:
    """Services built from this repository's Dockerfile → their command (args of `laneway`)."""
    out = {}
    for name, svc in services().items():
        if "build" in svc:
            command = svc.get("command")
            assert isinstance(command, list), f"{name}: write the command as a YAML list"
            out[name] = [interpolate(str(arg)) for arg in command]
    return out


def flag_value(command: list[str], flag: str) -> str | None:
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@functools.cache
def cli_help(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "laneway.cli", *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def exposed_ports(svc: dict) -> set[int]:
    ports = {int(str(p).split("/")[0]) for p in svc.get("expose", [])}
    for spec in svc.get("ports", []):
        target = spec.get("target") if isinstance(spec, dict) else interpolate(str(spec)).rsplit(":", 1)[-1]
        ports.add(int(str(target).split("/")[0]))
    return ports


# -- (a) the compose file validates ------------------------------------------------------------
def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_validates() -> None:
    command = compose_command()
    if command is None:
        pytest.skip(
            "no docker-compose binary: install Debian's `docker-compose` package "
            "(apt-get install -y docker-compose) or the Docker Compose v2 plugin"
        )
    # The defaults in the file, not the caller's settings.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LANEWAY_", "GRAFANA_", "PROMETHEUS_", "HF_", "COMPOSE_"))
    }
    env["GRAFANA_ADMIN_PASSWORD"] = "set-by-the-operator"  # the one variable without a default
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "is not set" not in result.stderr, f"a variable lacks a default: {result.stderr}"


# -- (b) commands are real laneway subcommands and flags -----------------------------------------
def test_services_run_real_subcommands_and_flags() -> None:
    from laneway.cli import build_parser

    commands = laneway_services()
    assert {c[0] for c in commands.values()} >= set(ROLES), f"the stack must run {ROLES}: {commands}"
    top = cli_help()
    for name, command in commands.items():
        words = PROVISION if command[:2] == PROVISION else command[:1]
        role = command[0]
        assert role in (*ROLES, "ops") and re.search(rf"\b{role}\b", top), (
            f"{name}: `laneway {role}` is not a subcommand"
        )
        text = cli_help(*words)
        for arg in command[len(words) :]:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                    f"{name}: `laneway {' '.join(words)} --help` has no {flag}"
                )
        try:
            args, rest = build_parser().parse_known_args(command)
        except SystemExit:
            pytest.fail(f"{name}: `laneway {' '.join(command)}` does not parse")
        assert not rest, f"{name}: unknown arguments {rest}"
        assert args.command == role


def test_provisioning_runs_once_before_every_service() -> None:
    commands = laneway_services()
    provisioners = [name for name, command in commands.items() if command[:2] == PROVISION]
    assert len(provisioners) == 1, f"one `laneway ops provision` service, got {provisioners}"
    name = provisioners[0]
    assert services()[name]["restart"] == "no", "a one-shot: it exits when done"
    for other in commands.keys() - {name}:
        assert services()[other]["depends_on"][name] == {"condition": "service_completed_successfully"}, (
            f"{other} must start after {name} succeeded"
        )
    bridge = next(c for c in commands.values() if c[0] == "bridge")
    assert flag_value(commands[name], "--settings") == flag_value(bridge, "--settings")
    mounts = {v for svc in (services()[name], services()["bridge"]) for v in svc["volumes"]}
    assert len({m for m in mounts if m.endswith("settings.toml:ro")}) == 1, "the same settings file"


def test_workers_pools_gpus_and_settings_agree() -> None:
    from core.settings import load_settings

    workers = {name: c for name, c in laneway_services().items() if c[0] == "worker"}
    pools = {flag_value(c, "--pool"): name for name, c in workers.items()}
    settings = load_settings(SETTINGS)
    for model, logical in settings.models.items():
        assert logical.pool in pools, (
            f"settings model {model!r} needs pool {logical.pool!r}; workers serve {sorted(pools)}"
        )
    demo = settings.tenants["demo"]
    assert demo.api_key_sha256 == [hashlib.sha256(PLACEHOLDER_KEY.encode()).hexdigest()]

    for name, command in workers.items():
        svc = services()[name]
        engine = flag_value(command, "--engine")
        if engine == "vllm":
            devices = svc["deploy"]["resources"]["reservations"]["devices"]
            assert all(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
            gpus = sum(len(d.get("device_ids", ())) or int(d.get("count", 0)) for d in devices)
            assert gpus == int(flag_value(command, "--tensor-parallel-size") or 1), (
                f"{name}: GPUs reserved and --tensor-parallel-size differ"
            )
        if engine == "openai":
            key_env = flag_value(command, "--upstream-key-env")
            assert key_env in svc.get("environment", {}), f"{name}: {key_env} is not passed to the container"


def test_nats_cluster_and_replicas() -> None:
    nodes = {name: svc for name, svc in services().items() if str(svc.get("image", "")).startswith("nats:")}
    assert len(nodes) == 3, f"a 3-node NATS cluster, got {sorted(nodes)}"
    volumes, names = set(), set()
    for name, svc in nodes.items():
        conf_mount = next(v for v in svc["volumes"] if v.endswith(":ro") and ".conf:" in v)
        conf = (ROOT / conf_mount.split(":")[0]).read_text()
        names.add(re.search(r"^server_name:\s*(\S+)", conf, re.M).group(1))
        assert "jetstream" in conf and "include ./auth/cluster-auth.conf" in conf, name
        volumes |= {v.split(":")[0] for v in svc["volumes"] if not v.startswith((".", "nats-auth:"))}
    routes = flag_value([str(a) for a in services()["nats-auth"]["command"]], "--routes")
    assert sorted(routes.split(",")) == [f"{node}:6222" for node in sorted(nodes)], "routes to every node"
    assert len(names) == 3 and len(volumes) == 3, "each node has its own server_name and volume"
    for name, command in laneway_services().items():
        urls = flag_value(command, "--nats-url") or ""
        assert {u.split("//")[1].split(":")[0] for u in urls.split(",")} == set(nodes), name
        if command[0] == "broker" or command[:2] == PROVISION:
            assert flag_value(command, "--replicas") == "3", f"{name}: streams need 3 replicas"


# -- (c) Prometheus scrapes what the services serve -----------------------------------------------
def scrape_targets() -> list[tuple[str, str, int]]:
    config = yaml.safe_load(PROMETHEUS.read_text())
    out = []
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                out.append((job["job_name"], host, int(port)))
        for sd in job.get("dns_sd_configs", []):
            out += [(job["job_name"], host, int(sd["port"])) for host in sd["names"]]
        assert set(job) <= {
            "job_name",
            "static_configs",
            "dns_sd_configs",
            "metrics_path",
            "scrape_interval",
            "scrape_timeout",
        }, f"{job['job_name']}: unchecked discovery"
    return out


def test_scrape_targets_are_services_on_exposed_ports() -> None:
    targets = scrape_targets()
    commands = laneway_services()
    for job, host, port in targets:
        assert host in services(), f"job {job}: {host} is not a compose service"
        assert port in exposed_ports(services()[host]), f"job {job}: {host} does not expose {port}"
        if host in commands:  # and the process really listens there
            command = commands[host]
            listens = flag_value(command, "--metrics-port") or flag_value(command, "--port")
            assert listens == str(port), f"job {job}: {host} serves metrics on {listens}, not {port}"
    scraped = {host for _, host, _ in targets}
    running = {name for name, command in commands.items() if command[:2] != PROVISION}  # not the one-shot
    assert running <= scraped, f"Laneway services nobody scrapes: {running - scraped}"
    config = yaml.safe_load(PROMETHEUS.read_text())
    for rule_file in config.get("rule_files", []):
        assert (PROMETHEUS.parent / rule_file).is_file(), rule_file


def test_every_process_kind_is_scraped_under_the_job_up_gives_it() -> None:
    """Compose scrapes every kind of process (bridge, broker, worker) and under one job name per
    kind, the one `laneway up`'s scrape config and the chart use (tests/deploy/test_helm_chart.py):
    a board or a rule that picks a job works on all three."""
    jobs_of: dict[str, set[str]] = {}
    for job, host, _ in scrape_targets():
        jobs_of.setdefault(host, set()).add(job)
    kinds = set()
    for name, command in laneway_services().items():
        if command[0] in KINDS:
            assert jobs_of.get(name) == {f"{JOB_PREFIX}{command[0]}"}, f"{name}: scraped by {jobs_of.get(name)}"
            kinds.add(command[0])
    assert kinds == set(KINDS), f"compose runs no {set(KINDS) - kinds}"


# -- (d) dashboards and alerts name metrics Laneway exports ---------------------------------------
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def metrics_classes() -> list[type]:
    """Every class named `*Metrics` in the product, laneway/ and loadtest/ that takes a
    `registry` (found in the source text first, so modules without one are never imported)."""
    found = []
    for package in METRICS_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            names = re.findall(r"^class\s+(\w+Metrics)\b", path.read_text(), re.M)
            if not names:
                continue
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            classes = [getattr(module, name) for name in names]
            found += [c for c in classes if "registry" in inspect.signature(c).parameters]
    return found


def exported_metrics() -> tuple[set[str], list[str]]:
    names: set[str] = set()
    classes = []
    for cls in metrics_classes():
        instance = cls(registry=CollectorRegistry())
        registry = getattr(instance, "registry", None)
        if not isinstance(registry, CollectorRegistry):
            continue
        classes.append(f"{cls.__module__}.{cls.__name__}")
        for family in registry.collect():
            names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names, classes


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, labels
    (inside {...} or grouping clauses), durations or numbers."""
    expr = _STRING.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = _GROUPING.sub("", expr)
    return {name for name in _IDENT.findall(expr) if name.lower() not in _KEYWORDS}


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            where = node.get("title", where) if "type" in node else where
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str) and value.strip():
                    out.append((f"dashboard panel {where!r}", value))
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(json.loads(DASHBOARD.read_text()), "?")
    return out


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_exprs() -> list[tuple[str, str]]:
    return [(f"rule {r.get('alert') or r.get('record')}", str(r["expr"])) for r in rules()]


def test_dashboard_and_alerts_use_exported_metrics() -> None:
    exported, classes = exported_metrics()
    assert classes, "no *Metrics class found"
    recorded = {r["record"] for r in rules() if "record" in r}
    uses = dashboard_exprs() + rule_exprs()
    assert len(dashboard_exprs()) >= 5 and any("alert" in r for r in rules())
    missing: dict[str, set[str]] = {}
    for where, expr in uses:
        names = promql_metrics(expr)
        assert names, f"{where}: no metric in {expr!r}"
        for name in names:
            known = name in recorded if ":" in name else name in exported
            if not known:
                missing.setdefault(name, set()).add(where)
    assert not missing, (
        "metrics used by deploy/ that Laneway does not export (searched "
        + ", ".join(classes)
        + "):\n"
        + "\n".join(f"  {name}: {', '.join(sorted(where))}" for name, where in sorted(missing.items()))
    )


def test_promql_extraction() -> None:
    expr = (
        '1e6 * sum by (model) (rate(laneway_cost_usd_total{tenant!="x"}[$__rate_interval])) '
        "/ ignoring(pool) group_left() histogram_quantile(0.95, sum(rate(a_bucket[5m] offset 1h))) "
        "> 1.2 * avg_over_time(laneway:cost:rate1h[7d])"
    )
    assert promql_metrics(expr) == {"laneway_cost_usd_total", "a_bucket", "laneway:cost:rate1h"}


# -- promtool, where installed (Debian: apt-get install prometheus) ------------------------------
def test_promtool_accepts_config_rules_and_queries(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool: install Debian's `prometheus` package to check PromQL syntax")
    for args in (["check", "config", str(PROMETHEUS)], ["check", "rules", str(RULES)]):
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    queries = [
        {"record": f"dashboard:query:{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_, expr) in enumerate(dashboard_exprs())
    ]
    probe = tmp_path / "dashboard_rules.yml"
    probe.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}))
    result = subprocess.run([promtool, "check", "rules", str(probe)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
