"""docker-compose.yml's exposure and NATS logins, and its NATS cluster run from its own files.

No Docker engine runs here. The file is read as `docker-compose config` resolves it (with every
variable unset but the one it requires; read with pyyaml where no compose binary is installed),
and the one-shot `nats-auth` service's script is run as compose runs it, its volumes in a temp
dir; then deploy/nats/nats-N.conf, with that volume where the nodes mount it, runs as a real
3-node nats-server cluster (loopback ports), provisioned through deploy/nats/login.py as the ops
user. On it: no anonymous client, no route without the route password, every role's login, and
a tenant's user fenced into its own account, all over TLS with the CA each container is given
(what TLS refuses: tests/deploy/test_compose_tls.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import pytest
import yaml

from tests.deploy.nats_checks import check_tenant_is_fenced, parse_accounts
from tests.unit.test_deploy_stack import compose_command, interpolate

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
NODES = ("nats-1", "nats-2", "nats-3")
LOGIN_MOUNT = "/run/laneway/nats"
GRAFANA_PASSWORD = "a-password-from-the-environment"


@functools.cache
def resolved() -> dict:
    if compose_command() is None:  # the file's defaults, with the one required variable set
        text = re.sub(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]*\}", GRAFANA_PASSWORD, COMPOSE.read_text())
        return yaml.safe_load(interpolate(text))
    result = compose_config({"GRAFANA_ADMIN_PASSWORD": GRAFANA_PASSWORD})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def compose_config(extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LANEWAY_", "GRAFANA_", "PROMETHEUS_", "HF_", "COMPOSE_"))
    }
    return subprocess.run(
        [*compose_command(), "-f", str(COMPOSE), "config"],
        cwd=ROOT,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def services() -> dict[str, dict]:
    return resolved()["services"]


def raw_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def volume_specs(svc: dict) -> list[tuple[str, str]]:
    """(source, target) of each mount, short or long syntax."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), v["target"]))
        else:
            source, target = str(v).split(":")[:2]
            out.append((source, target))
    return out


# -- exposure -----------------------------------------------------------------------------------
def test_ports_are_published_on_loopback_only() -> None:
    published = {}
    for name, svc in services().items():
        for spec in svc.get("ports", []):
            host_ip = spec.get("host_ip") if isinstance(spec, dict) else str(spec).rsplit(":", 2)[0]
            published.setdefault(name, []).append(host_ip)
    assert "bridge" in published, "the bridge is published"
    wide = {name: ips for name, ips in published.items() if any(ip != "127.0.0.1" for ip in ips)}
    assert not wide, f"published beyond loopback by default: {wide}"
    assert "LANEWAY_HTTP_BIND" in str(raw_services()["bridge"]["ports"]), "the bridge's bind is the operator's to widen"


def test_grafana_admin_password_comes_from_the_environment() -> None:
    value = raw_services()["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", value), f"a default password: {value}"
    assert services()["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == GRAFANA_PASSWORD
    if compose_command() is not None:
        result = compose_config({})
        assert result.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in result.stderr, result.stderr


def node_conf(node: str) -> str:
    source = next(s for s, t in volume_specs(raw_services()[node]) if t == "/etc/nats/nats.conf")
    return (ROOT / source).read_text()


def test_nats_monitoring_stays_on_each_nodes_loopback() -> None:
    for node in NODES:
        binds = re.findall(r"^\s*(http|https|http_port|monitor_port|https_port)\s*[:=]\s*(\S+)", node_conf(node), re.M)
        assert binds and all(value.startswith("127.0.0.1:") for _, value in binds), f"{node}: monitoring on {binds}"
    for name, svc in services().items():
        ports = [str(p) for p in svc.get("expose", [])] + [json.dumps(p) for p in svc.get("ports", [])]
        assert not [p for p in ports if "8222" in p], f"{name} exposes the NATS monitoring port"
    exporters = {name: svc for name, svc in services().items() if "prometheus-nats-exporter" in svc.get("image", "")}
    assert sorted(svc["network_mode"] for svc in exporters.values()) == [f"service:{n}" for n in NODES]
    assert all(svc["command"][-1] == "http://127.0.0.1:8222" for svc in exporters.values())


# -- logins ---------------------------------------------------------------------------------------
def role_of(command: list[str]) -> str:
    return command[0]  # broker | worker | bridge | ops (provision)


def test_each_laneway_container_logs_in_as_its_own_role_only() -> None:
    raw = raw_services()
    auth = raw["nats-auth"]
    command = [str(a) for a in auth["command"]]
    login_dirs = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--login")
    auth_mounts = dict(volume_specs(auth))
    mounted_by = {}
    for name, svc in raw.items():
        for source, _target in volume_specs(svc):
            mounted_by.setdefault(source, set()).add(name)
        if "build" not in svc:
            continue
        role = role_of([str(a) for a in svc["command"]])
        assert svc["entrypoint"][:2] == ["python", "/opt/laneway/login.py"], name
        assert svc["entrypoint"][2] == f"{LOGIN_MOUNT}/login.json", name
        logins = [(s, t) for s, t in volume_specs(svc) if s.startswith("nats-login-")]
        assert logins == [(f"nats-login-{role}", LOGIN_MOUNT)], f"{name}: {logins}"
        assert f"{LOGIN_MOUNT}:ro" in " ".join(str(v) for v in svc["volumes"]), f"{name}: writable login"
        assert auth_mounts[f"nats-login-{role}"] == login_dirs[role], f"nats-auth writes {role}'s login elsewhere"
    assert mounted_by["nats-auth"] == {"nats-auth", *NODES}, "only the nodes read every password"
    for role in login_dirs:
        users = mounted_by[f"nats-login-{role}"] - {"nats-auth"}
        assert users and all(role_of([str(a) for a in raw[u]["command"]]) == role for u in users), role


def test_the_bridge_gets_one_idempotency_secret_kept_across_runs(tmp_path: Path) -> None:
    """Every bridge replica mounts the same login, whose secret survives a rerun of nats-auth
    (a new one would re-map in-flight retries), and login.py hands it to `laneway` in its
    environment, which `laneway bridge` requires."""
    ports = {node: 6222 for node in NODES}
    first = json.loads((run_nats_auth(tmp_path, ports)["nats-login-bridge"] / "login.json").read_text())
    again = json.loads((run_nats_auth(tmp_path, ports)["nats-login-bridge"] / "login.json").read_text())
    secret = first["env"]["LANEWAY_IDEMPOTENCY_SECRET"]
    assert len(secret) >= 32 and again == first
    for role in ("broker", "worker", "ops"):
        assert "env" not in json.loads((tmp_path / f"nats-login-{role}" / "login.json").read_text()), role
    assert not any(secret in p.read_text() for p in (tmp_path / "nats-auth").iterdir()), "the NATS nodes read it"
    # login.py execs `laneway`: a stand-in on PATH prints the environment it was given.
    stand_in = tmp_path / "bin" / "laneway"
    stand_in.parent.mkdir()
    stand_in.write_text('#!/bin/sh\necho "$LANEWAY_NATS_USER $LANEWAY_IDEMPOTENCY_SECRET $*"\n')
    stand_in.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "deploy" / "nats" / "login.py"),
            str(tmp_path / "nats-login-bridge" / "login.json"),
            "bridge",
        ],
        env={**os.environ, "PATH": f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == [first["user"], secret, "bridge"], done.stderr


# -- the cluster, live ----------------------------------------------------------------------------
def on_host(svc: dict, tmp: Path) -> dict[str, Path]:
    """A service's container paths → this repo (bind mounts) or tmp (named volumes)."""
    return {t: (ROOT / s if s.startswith(".") else tmp / s) for s, t in volume_specs(svc)}


def host_path(arg: str, where: dict[str, Path]) -> str | None:
    for target, path in sorted(where.items(), key=lambda kv: -len(kv[0])):
        if arg == target or arg.startswith(target + "/"):
            return str(path) + arg[len(target) :]
    return None


def run_nats_auth(tmp: Path, route_ports: dict[str, int]) -> dict[str, Path]:
    """The one-shot as compose runs it, its volumes in tmp; routes to loopback ports (by the
    certificate's name for loopback: a route checks the name it dials)."""
    svc = raw_services()["nats-auth"]
    where = on_host(svc, tmp)

    def host(arg: str) -> str:
        if (path := host_path(arg, where)) is not None:
            return path
        if "=" in arg and (path := host_path(arg.split("=", 1)[1], where)) is not None:
            return f"{arg.split('=', 1)[0]}={path}"
        for node, port in route_ports.items():
            arg = arg.replace(f"{node}:6222", f"localhost:{port}")
        return arg

    assert svc["entrypoint"][0] == "python"
    args = [host(a) for a in [*svc["entrypoint"][1:], *map(str, svc["command"])]]
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    return {s: tmp / s for s, _ in volume_specs(svc) if not s.startswith(".")}


def write_node(tmp: Path, node: str, volumes: dict[str, Path], route_port: int, http_port: int) -> Path:
    """deploy/nats/<node>.conf beside its volume, as the node mounts them, on loopback ports."""
    directory = tmp / f"etc-{node}"
    directory.mkdir()
    for source, target in volume_specs(raw_services()[node]):
        if target.startswith("/etc/nats/") and source in volumes:
            (directory / target.removeprefix("/etc/nats/")).symlink_to(volumes[source])
    text = node_conf(node)
    text = text.replace("http: 127.0.0.1:8222", f"http: 127.0.0.1:{http_port}")
    text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route_port}")
    text = text.replace('"/etc/nats/', f'"{directory}/')  # the certificate's paths
    text = re.sub(r"^\s*store_dir:.*$", "", text, flags=re.M)  # NatsServer passes -sd
    (directory / "nats.conf").write_text(text)
    return directory / "nats.conf"


@dataclass
class ComposeCluster:
    """deploy/nats/nats-N.conf as 3 real nodes on loopback, with what `nats-auth` wrote for them."""

    tmp: Path
    volumes: dict[str, Path]
    route_ports: dict[str, int]
    http_ports: dict[str, int]
    servers: list = field(default_factory=list)

    def nats_url(self, service: str) -> str:
        """The service's --nats-url, each node at its loopback port, by the certificate's name."""
        command = [str(a) for a in raw_services()[service]["command"]]
        url = command[command.index("--nats-url") + 1]
        for node, server in zip(NODES, self.servers, strict=True):
            url = url.replace(f"{node}:4222", f"localhost:{server.port}")
        return url

    def env(self, service: str) -> dict[str, str]:
        """The service's environment, its paths in its mounts on this host."""
        svc = services()[service]
        where = on_host(svc, self.tmp)
        return {k: host_path(str(v), where) or str(v) for k, v in svc.get("environment", {}).items()}


@asynccontextmanager
async def compose_cluster(tmp: Path) -> AsyncIterator[ComposeCluster]:
    from core.natsd import NatsServer
    from core.ports import free_port

    cluster = ComposeCluster(tmp, {}, {node: free_port() for node in NODES}, {node: free_port() for node in NODES})
    cluster.volumes = run_nats_auth(tmp, cluster.route_ports)
    cluster.servers = [
        NatsServer(
            tmp / f"store-{node}",
            config_file=write_node(tmp, node, cluster.volumes, cluster.route_ports[node], cluster.http_ports[node]),
        )
        for node in NODES
    ]
    await asyncio.gather(*(s.start() for s in cluster.servers))
    try:
        yield cluster
    finally:
        await asyncio.gather(*(s.stop() for s in cluster.servers))


def trusting(ca: str | Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client's TLS trusting `ca` alone, showing `cert` (with `key`) if given."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


async def route_refused_without_password(port: int, node_tls: ssl.SSLContext) -> bool:
    """Even with the nodes' own certificate, a route that knows no password is refused."""
    reader, writer = await asyncio.open_connection("localhost", port, ssl=node_tls)
    try:
        assert (await reader.readline()).startswith(b"INFO ")
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"intruder","cluster":"laneway"}\r\nPING\r\n')
        await writer.drain()
        return b"Authorization Violation" in await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_compose_nats_cluster_runs_with_the_generated_accounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with compose_cluster(tmp_path) as cluster:
        volumes = cluster.volumes
        credentials = json.loads((volumes["nats-auth"] / "nats-credentials.json").read_text())
        accounts = parse_accounts((volumes["nats-auth"] / "nats-auth.conf").read_text())
        assert set(accounts) == {"LANEWAY", "TENANT_demo"}, "the tenants of deploy/settings.toml"
        url = cluster.nats_url("provision")
        urls = url.split(",")
        service_env = cluster.env("provision")
        ca = service_env["LANEWAY_NATS_TLS_CA"]
        tls = trusting(ca)
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(urls[0], tls=tls, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
        auth = volumes["nats-auth"]
        node_tls = trusting(auth / "ca.pem", auth / "nats-tls.crt", auth / "nats-tls.key")
        assert await route_refused_without_password(cluster.route_ports["nats-1"], node_tls)
        # The provision service's command, through the entrypoint it runs with, in its environment:
        # the streams at 3 replicas need the routes up, which need the route password.
        svc = raw_services()["provision"]
        command = [str(a) for a in svc["command"]]
        command[command.index("--nats-url") + 1] = url
        command[command.index("--settings") + 1] = str(ROOT / "deploy" / "settings.toml")
        login = volumes["nats-login-ops"] / "login.json"
        env = {**os.environ, **service_env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(ROOT / "deploy" / "nats" / "login.py"), str(login), *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        for role in ("broker", "worker", "bridge", "ops"):
            mine = json.loads((volumes[f"nats-login-{role}"] / "login.json").read_text())
            assert credentials[mine["user"]] == mine["password"]
            assert set(mine) == {"user", "password"} | ({"env"} if role == "bridge" else set()), role
            nc = await nats.connect(urls, user=mine["user"], password=mine["password"], tls=tls)
            await nc.close()
        ops = json.loads(login.read_text())
        # nats_checks connects with nats-py's default TLS context: the system's CAs, here the compose CA.
        monkeypatch.setenv("SSL_CERT_FILE", ca)
        await check_tenant_is_fenced(urls, "demo", credentials["tenant-demo"], (ops["user"], ops["password"]))
