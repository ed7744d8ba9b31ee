"""Writes deploy/helm/laneway/files/nats-accounts.json: the NATS accounts `laneway/nats_config.py`
generates, less the passwords, for the chart to fill in (a chart cannot run Python).

The chart learns its tenants only at install time (from its settings), so the tenant account is
written once, for a tenant named `__tenant__`; the chart copies it per tenant, replacing that
token, and appends each copy's exports to the service account's. tests/deploy/test_helm_chart.py
fails when this file has drifted, and checks that the chart's rendered accounts equal
`nats_config.accounts()` for the same tenants and passwords.

    .venv/bin/python deploy/helm/generate_nats_permissions.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy" / "helm" / "laneway" / "files" / "nats-accounts.json"
PREFIX = "lw"           # the chart runs every process with the default subject prefix
TENANT = "__tenant__"   # a valid tenant token that no real subject contains


def _without_passwords(account: dict) -> dict:
    users = [{k: v for k, v in u.items() if k != "password"} for u in account["users"]]
    return {**account, "users": users}


def generate() -> str:
    sys.path.insert(0, str(ROOT))
    from laneway.nats_config import (
        ROLES,
        SERVICE_ACCOUNT,
        accounts,
        tenant_account,
        tenant_exports,
        user_name,
        user_names,
    )
    from schemas.subjects import Subjects

    s = Subjects(PREFIX)
    layout = accounts(s, [TENANT], dict.fromkeys(user_names([TENANT]), ""))
    service, tenant = layout[SERVICE_ACCOUNT], layout[tenant_account(TENANT)]
    assert service["exports"] == tenant_exports(s, TENANT), "exports are per tenant"
    spec = {
        "prefix": PREFIX,
        "tenant_token": TENANT,
        "roles": {role: user_name(role) for role in ROLES},
        "service_account": {"name": SERVICE_ACCOUNT, **_without_passwords({**service, "exports": []})},
        "tenant_exports": service["exports"],
        "tenant_account": {"name": tenant_account(TENANT), **_without_passwords(tenant)},
    }
    return json.dumps(spec, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(generate())
    print(f"wrote {OUT.relative_to(ROOT)}")
