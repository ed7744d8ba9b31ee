"""`up_auth` and the accounts it writes: private files, passwords kept across restarts, configs
the real nats-server accepts (`nats-server -t`), tenants each in an account that imports only its
own protocol, and no role with more JetStream rights than it needs. Whether the roles are ENOUGH
is tests/integration/test_nats_isolation.py's job; the attacks are tests/security/'s."""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
from pathlib import Path

import pytest

from core.natsd import server_binary
from core.policy.tenants import Tenant
from laneway.cli import build_parser
from laneway.nats_config import (
    SERVICE_ACCOUNT,
    TenantLimits,
    accounts,
    accounts_block,
    generate_passwords,
    render,
    run,
    up_auth,
)
from laneway.nats_permissions import ROLES, service_permissions, tenant_permissions, user_name
from schemas.subjects import BadToken, Subjects, service_inbox

S = Subjects("lw")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def nats_server_accepts(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([server_binary(), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30)


def test_up_auth_writes_private_files_with_every_user(tmp_path):
    auth = up_auth(S, ["acme", "globex"], tmp_path / "data")
    assert mode(auth.authorization_file) == 0o600 and mode(auth.credentials_file) == 0o600
    passwords = json.loads(auth.credentials_file.read_text())
    assert set(auth.services) == set(ROLES) and set(auth.tenants) == {"acme", "globex"}
    assert auth.services["broker"] == ("svc-broker", passwords["svc-broker"])
    assert auth.services["ops"] == ("ops", passwords["ops"])
    assert auth.tenants["acme"] == ("tenant-acme", passwords["tenant-acme"])
    assert len(set(passwords.values())) == len(passwords) == 6
    text = auth.authorization_file.read_text()
    assert text.startswith("accounts {") and all(p in text for p in passwords.values())


def test_a_restart_keeps_the_passwords_and_follows_the_tenant_list(tmp_path):
    first = up_auth(S, ["acme", "globex"], tmp_path)
    again = up_auth(S, ["acme", "globex"], tmp_path)
    assert again == first
    changed = up_auth(S, ["acme", "initech", "acme"], tmp_path)
    assert changed.services == first.services and changed.tenants["acme"] == first.tenants["acme"]
    text = changed.authorization_file.read_text()
    assert "globex" not in changed.tenants and "tenant-globex" not in text and text.count('"tenant-acme"') == 1
    assert changed.tenants["initech"][1] not in [p for _, p in [*first.services.values(), *first.tenants.values()]]


def test_every_generated_password_passes_as_the_argument_after_its_flag():
    """`--nats-password <it>` from an operator's shell: argparse reads a value that starts with `-`
    as a flag ("expected one argument"). A URL-safe token did so one time in 64."""
    parser = build_parser()
    for _ in range(200):
        for user, password in generate_passwords(["acme"]).items():
            args = parser.parse_args(
                ["usage", "--tenant", "acme", "--since", "2026-01-01", "--nats-user", user, "--nats-password", password]
            )
            assert args.nats_password == password and len(password) >= 32


def test_files_left_readable_by_others_are_made_private(tmp_path):
    auth = up_auth(S, [], tmp_path)
    auth.credentials_file.chmod(0o644)
    auth.authorization_file.chmod(0o644)
    up_auth(S, [], tmp_path)
    assert mode(auth.authorization_file) == 0o600 and mode(auth.credentials_file) == 0o600


def test_unreadable_credentials_are_an_error_not_new_passwords(tmp_path):
    (tmp_path / "nats-credentials.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"nats-credentials\.json.*delete it"):
        up_auth(S, [], tmp_path)
    with pytest.raises(BadToken):
        up_auth(S, ["a.b"], tmp_path / "other")
    with pytest.raises(BadToken):  # `^...$` matched before a final newline: a subject split in two
        up_auth(S, ["acme\n"], tmp_path / "newline")


def test_nats_server_accepts_the_block_alone_included_and_the_whole_config(tmp_path):
    auth = up_auth(S, ["acme"], tmp_path)
    (tmp_path / "server.conf").write_text(f'jetstream {{}}\ninclude "{auth.authorization_file.name}"\n')
    (tmp_path / "whole.conf").write_text(render(S, ["acme"], generate_passwords(["acme"])))
    for config in (auth.authorization_file, tmp_path / "server.conf", tmp_path / "whole.conf"):
        result = nats_server_accepts(config)
        assert result.returncode == 0, result.stderr + result.stdout
    assert accounts_block(S, [], generate_passwords([])).count('"user"') == len(ROLES)


def test_jetstream_rights_are_per_verb_and_stream():
    roles = service_permissions(S)
    publish = {role: roles[role]["publish"]["allow"] for role in ROLES}
    # A purge only where a deletion must really delete, in the bridges' own state: a deleted
    # file's chunks, a finalized batch's lines (one subject each). Never a log or the queue.
    own_purges = {f"$JS.API.STREAM.PURGE.OBJ_{S.bucket('file_data')}", f"$JS.API.STREAM.PURGE.{S.batch_stream}"}
    for role, subjects in publish.items():
        assert not any(s in ("$JS.API.>", ">", "$KV.>", "_INBOX.>") for s in subjects), role
        assert not any(".STREAM.DELETE." in s for s in subjects), role
        # ... and no consumer of anything, but for ops those of the queue (installs made before
        # (class, tenant) consumers had others, which would overlap them)
        deletes = {s for s in subjects if ".CONSUMER.DELETE." in s}
        assert deletes == ({f"$JS.API.CONSUMER.DELETE.{S.req_stream}.*"} if role == "ops" else set())
        purges = {s for s in subjects if ".STREAM.PURGE." in s}
        assert purges == (own_purges if role == "bridge" else set()), role
    # Only the broker takes requests off the work queue, or removes one (the DLQ move).
    takers = {
        role
        for role, subjects in publish.items()
        if any("MSG.NEXT.LW_REQ" in s or "MSG.DELETE.LW_REQ" in s for s in subjects)
    }
    assert takers == {"broker"}
    assert not any(s.startswith(("lw.", "$JS.ACK")) for s in publish["ops"])
    # Only ops provisions: no service creates or changes a stream, the durable or a live bucket; a
    # service creates only the buckets of its own runtime state (quota, response cache).
    provisioned = [
        S.req_stream,
        S.usage_stream,
        S.dlq_stream,
        S.audit_stream,
        *(f"KV_{S.bucket(name)}" for name in ("classes", "tenants", "routing")),
    ]
    making = {f"$JS.API.STREAM.{verb}.{stream}" for verb in ("CREATE", "UPDATE") for stream in provisioned}
    making.add(f"$JS.API.CONSUMER.CREATE.{S.req_stream}.*")
    assert {role for role, subjects in publish.items() if making & set(subjects)} == {"ops"}
    assert making <= set(publish["ops"])
    assert all(len(subjects) == len(set(subjects)) for subjects in publish.values())
    tenant = tenant_permissions(S, "acme", ["interactive", "batch"])
    assert tenant["publish"]["allow"] == ["lw.req.interactive.acme", "lw.req.batch.acme", "lw.cancel.acme.*"]
    assert tenant["subscribe"]["allow"] == ["lw.tok.acme.>", "_INBOX.>", "_INBOX_acme.>"]


def test_each_tenant_account_imports_only_its_own_protocol():
    tenants = ["acme", "globex"]
    accts = accounts(S, tenants, generate_passwords(tenants), TenantLimits(max_connections=3))
    assert set(accts) == {SERVICE_ACCOUNT, "TENANT_acme", "TENANT_globex"}
    services = accts[SERVICE_ACCOUNT]
    assert services["jetstream"] == "enabled"
    assert {u["user"] for u in services["users"]} == {"svc-broker", "svc-worker", "svc-bridge", "ops"}
    acme = accts["TENANT_acme"]
    assert "jetstream" not in acme, "a tenant has no JetStream of its own: no API to reach"
    assert [u["user"] for u in acme["users"]] == ["tenant-acme"]
    assert acme["limits"]["max_connections"] == 3
    imported = [(kind, spec["subject"]) for i in acme["imports"] for kind, spec in i.items()]
    assert imported == [
        ("service", "lw.req.interactive.acme"),
        ("service", "lw.req.standard.acme"),
        ("service", "lw.req.batch.acme"),
        ("service", "lw.cancel.acme.*"),
        ("stream", "lw.tok.acme.>"),
    ]
    # Every export names the one account that may import it: no public export.
    for export in services["exports"]:
        subject = export.get("service") or export["stream"]
        tenant = "acme" if ".acme" in subject else "globex"
        assert export["accounts"] == [f"TENANT_{tenant}"], export


def test_each_service_user_reads_only_its_own_inbox():
    roles = service_permissions(S)
    for role in ROLES:
        inboxes = [s for s in roles[role]["subscribe"]["allow"] if s.startswith("_INBOX")]
        assert inboxes == [f"{service_inbox(user_name(role))}.>"], role
    assert len({service_inbox(user_name(role)) for role in ROLES}) == len(ROLES)
    assert service_inbox("ops@corp.example") == "_INBOX_ops_corp_example"  # one token, always
    assert service_inbox(None) == "_INBOX"


def test_a_tenant_user_reaches_only_the_classes_its_document_lists(tmp_path):
    """A class token is the publisher's word: `lw.req.*.<tenant>` would let a tenant store a
    backlog in every token it can invent. Its document's classes are exported, imported and
    permitted, each; a bare name gets a new tenant's default classes."""
    nightly = Tenant(name="nightly", default_class="batch", classes=["batch", "batch"])
    accts = accounts(S, [nightly, "acme"], generate_passwords(["nightly", "acme"]))
    requests = {e["service"] for e in accts[SERVICE_ACCOUNT]["exports"] if ".req." in e.get("service", "")}
    assert requests == {"lw.req.batch.nightly", *(f"lw.req.{c}.acme" for c in ("interactive", "standard", "batch"))}
    account = accts["TENANT_nightly"]
    assert account["users"][0]["permissions"]["publish"]["allow"] == ["lw.req.batch.nightly", "lw.cancel.nightly.*"]
    assert [i["service"]["subject"] for i in account["imports"] if "service" in i] == [
        "lw.req.batch.nightly",
        "lw.cancel.nightly.*",
    ]
    assert not any("*" in s for s in requests)
    assert up_auth(S, {"nightly": nightly}.values(), tmp_path).tenants.keys() == {"nightly"}
    assert '"lw.req.batch.nightly"' in (tmp_path / "nats-auth.conf").read_text()
    # `laneway nats-config --settings`: the settings' classes, also for a name given again.
    (tmp_path / "settings.toml").write_text('[tenants.nightly]\ndefault_class = "batch"\nclasses = ["batch"]\n')
    args = argparse.Namespace(
        tenant=["nightly", "acme"],
        settings=str(tmp_path / "settings.toml"),
        prefix="lw",
        port=4222,
        store_dir=None,
        out=tmp_path / "nats.conf",
        credentials_out=tmp_path / "creds.json",
    )
    assert run(args) == 0
    written = json.loads((tmp_path / "nats.conf").read_text())["accounts"]
    assert written["TENANT_nightly"]["imports"][0]["service"]["subject"] == "lw.req.batch.nightly"
    assert len(written["TENANT_nightly"]["imports"]) == 3 and len(written["TENANT_acme"]["imports"]) == 5
    assert nats_server_accepts(tmp_path / "nats.conf").returncode == 0
