"""Attacks on the deployed NATS configs, read as nats-server reads them: the accounts the Helm chart
renders (defaults, and ci/all-on-values.yaml with two tenants) and the ones docker-compose.yml's
`nats-auth` service writes for deploy/settings.toml. Issue 20: on the main these were written
against, the chart's users shared one account (a tenant could name `$KV.lw_tenants.<other>` as a
reply and have JetStream write there) and compose's NATS took anyone, its monitor open to every
container. Live versions of the tenant attacks run in tests/deploy/ on both clusters.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import pytest

from laneway.nats_config import SERVICE_ACCOUNT
from tests.deploy.nats_checks import FORBIDDEN, S, parse_accounts, subject_matches, user_accounts

SOURCES = ("helm-default", "helm-all-on", "compose")


@functools.cache
def accounts_of(source: str) -> dict:
    if source.startswith("helm-"):
        from tests.deploy.test_helm_chart import rendered_accounts

        return rendered_accounts(source.removeprefix("helm-"))
    from tests.deploy.test_compose import run_nats_auth

    with tempfile.TemporaryDirectory() as tmp:
        volumes = run_nats_auth(Path(tmp), {})
        return parse_accounts((volumes["nats-auth"] / "nats-auth.conf").read_text())


def tenant_users(source: str) -> list[tuple[str, str, dict]]:
    """(tenant, its user's account name, the user's entry) for every tenant user."""
    users = user_accounts(accounts_of(source))
    found = [
        (u.removeprefix("tenant-"), account, entry) for u, (account, entry) in users.items() if u.startswith("tenant-")
    ]
    assert found, f"{source}: no tenant has a NATS user of its own"
    return found


def imported(account: dict) -> list[str]:
    return [next(iter(i.values()))["subject"] for i in account.get("imports", [])]


@pytest.mark.parametrize("source", SOURCES)
def test_a_tenant_user_lives_in_an_account_of_its_own_without_jetstream(source: str) -> None:
    accounts = accounts_of(source)
    for tenant, account, _ in tenant_users(source):
        assert account == f"TENANT_{tenant}", f"tenant-{tenant} logs in to {account}"
        assert [u["user"] for u in accounts[account]["users"]] == [f"tenant-{tenant}"]
        assert "jetstream" not in accounts[account], f"{account} has JetStream"
    assert [name for name, a in accounts.items() if "jetstream" in a] == [SERVICE_ACCOUNT]
    assert not [
        u
        for u in user_accounts(accounts)
        if u.startswith("tenant-") and user_accounts(accounts)[u][0] == SERVICE_ACCOUNT
    ]


@pytest.mark.parametrize("source", SOURCES)
def test_a_tenant_cannot_publish_into_the_control_plane_or_another_tenant(source: str) -> None:
    accounts = accounts_of(source)
    for tenant, account, entry in tenant_users(source):
        allow = entry["permissions"]["publish"]["allow"]
        reachable = allow + imported(accounts[account])
        for subject in (f.format(tenant=tenant, other=f"x{tenant}") for f in FORBIDDEN):
            assert not [a for a in reachable if subject_matches(a, subject)], f"tenant-{tenant} reaches {subject}"
        # Its own requests, each class by name (its settings' classes): never a class wildcard.
        requests = [a for a in allow if a.startswith(f"{S.prefix}.req.")]
        assert requests, f"tenant-{tenant} publishes no request"
        assert all(a.split(".")[2] not in ("*", ">") and a == S.req(a.split(".")[2], tenant) for a in requests), (
            requests
        )
        # Only its own subjects cross into its account, and only from the service account.
        for i in accounts[account]["imports"]:
            source_account = next(iter(i.values()))["account"]
            subject = next(iter(i.values()))["subject"]
            assert source_account == SERVICE_ACCOUNT and tenant in subject.split("."), (account, i)
        other_tokens = f"{S.tok_tenant_prefix('x' + tenant)}r1"
        readable = entry["permissions"]["subscribe"]["allow"] + imported(accounts[account])
        assert not [a for a in readable if subject_matches(a, other_tokens)], f"tenant-{tenant} reads {other_tokens}"


@pytest.mark.parametrize("source", SOURCES)
def test_the_service_account_exports_to_each_tenant_only_its_own_subjects(source: str) -> None:
    exports = accounts_of(source)[SERVICE_ACCOUNT]["exports"]
    tenants = {t for t, _, _ in tenant_users(source)}
    assert exports and {e["accounts"][0].removeprefix("TENANT_") for e in exports} == tenants
    for e in exports:
        (tenant,) = [a.removeprefix("TENANT_") for a in e["accounts"]]
        subject = e.get("service") or e["stream"]
        assert tenant in subject.split("."), e
        if subject.startswith(f"{S.prefix}.req."):  # each class the tenant may use
            # One reply, rewritten by the server: the PubAck can only go back to the publisher.
            assert e["response_type"] == "singleton", e


def test_the_helm_nats_monitor_is_reachable_from_no_pod() -> None:
    from tests.deploy.test_helm_chart import named
    from tests.deploy.test_helm_hardening import allowed, outsiders, pods

    for variant in ("default", "all-on"):
        service_ports = {p["port"] for p in named(variant, "Service", "demo-nats")["spec"]["ports"]}
        assert 8222 not in service_ports, f"{variant}: the NATS Service publishes the monitor"
        p = pods(variant)
        attackers = {**outsiders(), "a worker (image_url fetches)": p["small"], "the bridge": p["bridge"]}
        reached = [who for who, pod in attackers.items() if allowed(variant, pod, p["nats"], "monitor")]
        assert not reached, f"{variant}: the NATS monitor answers {reached}"


def test_the_compose_nats_monitor_is_on_each_nodes_loopback_only() -> None:
    from tests.deploy.test_compose import NODES, node_conf, services

    for node in NODES:
        http = re.findall(r"^\s*http\w*\s*[:=]\s*(\S+)", node_conf(node), re.M)
        assert http and all(h.startswith("127.0.0.1:") for h in http), f"{node} monitors on {http}"
    published = [
        (name, p)
        for name, svc in services().items()
        for p in [*svc.get("expose", []), *svc.get("ports", [])]
        if "8222" in str(p)
    ]
    assert not published, f"the NATS monitor is exposed: {published}"
