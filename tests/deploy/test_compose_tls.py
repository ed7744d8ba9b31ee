"""docker-compose.yml's NATS speaks TLS only, to clients and between its nodes, under the private CA
that the one-shot `nats-auth` service issues (deploy/nats/certs.py), and Laneway trusts that CA.

Live: deploy/nats/nats-N.conf run as 3 real nodes with what nats-auth wrote, as
tests/deploy/test_compose.py runs them (loopback ports, reached by the certificate's `localhost`).
A Laneway service connects with its own login and the CA its container is given; a client
speaking plain text, or one that does not trust the CA, gets nowhere; the routes form the cluster
over TLS and take no connection without the nodes' certificate.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import ssl
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from core.connect import NatsSettings, connect, connect_once
from tests.deploy.test_compose import (
    LOGIN_MOUNT,
    NODES,
    ROOT,
    ComposeCluster,
    compose_cluster,
    raw_services,
    run_nats_auth,
    services,
    trusting,
    volume_specs,
)
from tests.unit.test_deploy_stack import flag_value, laneway_services
from tests.wait import eventually

_spec = importlib.util.spec_from_file_location("compose_certs", ROOT / "deploy" / "nats" / "certs.py")
certs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(certs)

ROLES = ("broker", "worker", "bridge", "ops")


def tls_names() -> list[str]:
    return flag_value([str(a) for a in raw_services()["nats-auth"]["command"]], "--tls-names").split(",")


# -- what compose asks for ------------------------------------------------------------------------
def test_every_laneway_container_dials_tls_and_trusts_the_ca_in_its_login() -> None:
    auth = raw_services()["nats-auth"]
    assert ("./deploy/nats/certs.py", "/opt/laneway/certs.py") in volume_specs(auth), "beside compose_auth.py"
    names = set(tls_names())
    routes = flag_value([str(a) for a in auth["command"]], "--routes").split(",")
    assert {r.rsplit(":", 1)[0] for r in routes} <= names, "a route checks the name it dials"
    for name, command in laneway_services().items():
        urls = flag_value(command, "--nats-url").split(",")
        assert all(u.startswith("tls://") for u in urls), f"{name}: {urls}"
        assert {u.removeprefix("tls://").rsplit(":", 1)[0] for u in urls} <= names, name
        ca = services()[name]["environment"]["LANEWAY_NATS_TLS_CA"]
        assert ca == f"{LOGIN_MOUNT}/{certs.CA_FILE}", f"{name}: the CA from its own login volume, got {ca}"


def test_the_certificate_is_kept_across_runs_and_its_cas_key_nowhere(tmp_path: Path) -> None:
    ports = {node: 6222 for node in NODES}
    volumes = run_nats_auth(tmp_path, ports)
    auth = volumes["nats-auth"]
    first = {f: (auth / f).read_bytes() for f in (certs.CA_FILE, certs.CERT_FILE, certs.KEY_FILE)}
    run_nats_auth(tmp_path, ports)
    assert {f: (auth / f).read_bytes() for f in first} == first, "a rerun keeps the certificate"
    assert (auth / certs.KEY_FILE).stat().st_mode & 0o077 == 0
    cert = x509.load_pem_x509_certificate(first[certs.CERT_FILE])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(tls_names()) == sorted([*NODES, "localhost"])
    for role in ROLES:
        assert (volumes[f"nats-login-{role}"] / certs.CA_FILE).read_bytes() == first[certs.CA_FILE], role
    keys = [p for v in volumes.values() for p in v.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]
    assert keys == [auth / certs.KEY_FILE], f"only the nodes' key is written: {keys}"


def test_a_certificate_near_its_end_or_for_other_names_is_replaced(tmp_path: Path) -> None:
    names = ["nats-1", "localhost"]
    ca = certs.ensure(tmp_path, names)
    assert certs.ensure(tmp_path, names) == ca
    late = datetime.now(UTC) + certs.LIFETIME - certs.RENEW_BEFORE + timedelta(days=1)
    renewed = certs.ensure(tmp_path, names, now=late)
    assert renewed != ca and certs.ensure(tmp_path, names) == renewed
    assert certs.ensure(tmp_path, [*names, "nats-2"]) != renewed
    (tmp_path / certs.KEY_FILE).write_text(certs.issue(names, datetime.now(UTC))[2].decode())
    assert certs.ensure(tmp_path, [*names, "nats-2"]) != renewed, "a key that is not the certificate's"


# -- live -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory):
    async with compose_cluster(tmp_path_factory.mktemp("compose-tls")) as running:
        yield running


def login_of(cluster: ComposeCluster, role: str) -> tuple[str, str]:
    login = json.loads((cluster.volumes[f"nats-login-{role}"] / "login.json").read_text())
    return login["user"], login["password"]


def monitor(cluster: ComposeCluster, node: str, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_ports[node]}/{path}", timeout=5) as r:
        return json.load(r)


async def first_line(port: int, tls: ssl.SSLContext | None) -> bytes:
    """What a port says first: b"" where the connection fails or closes before a line."""
    try:
        reader, writer = await asyncio.open_connection("localhost", port, ssl=tls)
    except (ssl.SSLError, ConnectionError):
        return b""
    try:
        return await asyncio.wait_for(reader.readline(), 10)
    except (ssl.SSLError, ConnectionError):
        return b""
    finally:
        writer.close()


async def test_a_service_connects_over_tls_with_its_login_and_the_compose_ca(cluster: ComposeCluster) -> None:
    user, password = login_of(cluster, "broker")
    n = NatsSettings(
        url=cluster.nats_url("broker"),
        user=user,
        password=password,
        tls_ca=cluster.env("broker")["LANEWAY_NATS_TLS_CA"],
    )
    nc = await connect(n, "laneway-broker-tls-test")
    try:
        await nc.flush()
        node = next(node for node, s in zip(NODES, cluster.servers, strict=True) if s.port == nc.connected_url.port)
        connections = monitor(cluster, node, "connz?auth=1")["connections"]
        mine = [c for c in connections if c.get("name") == "laneway-broker-tls-test"]
        assert len(mine) == 1 and mine[0]["authorized_user"] == user, mine
        assert mine[0]["tls_version"].startswith("1."), f"not over TLS: {mine[0]}"
    finally:
        await nc.close()


async def test_a_plain_text_client_is_refused(cluster: ComposeCluster) -> None:
    """Even with a valid login: the server waits for a TLS handshake and drops what is not one."""
    user, password = login_of(cluster, "broker")
    reader, writer = await asyncio.open_connection("127.0.0.1", cluster.servers[0].port)
    try:
        info = json.loads((await reader.readline()).removeprefix(b"INFO "))
        assert info["tls_required"] is True
        connect_line = json.dumps({"verbose": False, "pedantic": False, "user": user, "pass": password})
        writer.write(f"CONNECT {connect_line}\r\nPING\r\n".encode())
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b"", "the server answered a plain-text client"
    finally:
        writer.close()


@pytest.mark.parametrize("trust", ["system", "another CA"])
async def test_a_client_that_does_not_trust_the_compose_ca_is_refused(
    cluster: ComposeCluster, trust: str, tmp_path: Path
) -> None:
    user, password = login_of(cluster, "broker")
    ca = None
    if trust == "another CA":
        ca = tmp_path / "other-ca.pem"
        ca.write_bytes(certs.issue(tls_names(), datetime.now(UTC))[0])
    n = NatsSettings(url=cluster.nats_url("broker"), user=user, password=password, tls_ca=str(ca) if ca else None)

    async def quiet(exc: Exception) -> None:
        pass

    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        await connect_once(n, "laneway-untrusting", error_cb=quiet)


async def test_the_nodes_route_to_each_other_over_tls_only(cluster: ComposeCluster) -> None:
    def meshed() -> bool:
        """Each node routes to the two others, and JetStream's meta group (Raft over the routes)
        has one leader that all three name, with both followers current."""
        metas = {node: monitor(cluster, node, "jsz").get("meta_cluster", {}) for node in NODES}
        leaders = {meta.get("leader") for meta in metas.values()}
        if len(leaders) != 1 or not leaders <= set(NODES):
            return False
        followers = metas[leaders.pop()]["replicas"]
        return (
            len(followers) == 2
            and all(r["current"] for r in followers)
            and all(
                {r["remote_name"] for r in monitor(cluster, node, "routez")["routes"]} == set(NODES) - {node}
                for node in NODES
            )
        )

    assert await eventually(meshed, timeout=30), "the routes did not form the cluster"
    for node in NODES:
        varz = monitor(cluster, node, "varz")["cluster"]
        assert varz["tls_required"] and varz["tls_verify"], f"{node}: routes without (mutual) TLS: {varz}"
    auth = cluster.volumes["nats-auth"]
    port = cluster.route_ports["nats-2"]
    node_tls = trusting(auth / certs.CA_FILE, auth / certs.CERT_FILE, auth / certs.KEY_FILE)
    assert (await first_line(port, node_tls)).startswith(b"INFO "), "the nodes' own certificate is taken"
    assert await first_line(port, None) == b"", "a plain-text route was answered"
    assert await first_line(port, trusting(auth / certs.CA_FILE)) == b"", "a route without the nodes' certificate"
