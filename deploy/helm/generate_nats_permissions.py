"""Writes deploy/helm/laneway/files/nats-accounts.json: the NATS accounts `laneway/nats_config.py`
generates, less the passwords, for the chart to fill in (a chart cannot run Python).

The chart learns its tenants only at install time (from its settings), so the tenant account is
written once, for a tenant named `__tenant__` with one class, `__class__`; the chart copies it per
tenant, replacing that token, and appends each copy's exports to the service account's. What
names the class (the request subject: its export, import and publish right) is kept apart, and
the chart repeats it for each class the tenant's settings list (`default_classes` when they list
none), in front of the rest, as the code orders them. tests/deploy/test_helm_chart.py
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
PREFIX = "lw"  # the chart runs every process with the default subject prefix
TENANT = "__tenant__"  # a valid tenant token that no real subject contains
CLASS = "__class__"  # and a class token


def _without_passwords(account: dict) -> dict:
    users = [{k: v for k, v in u.items() if k != "password"} for u in account["users"]]
    return {**account, "users": users}


def _split(items: list, with_class: list) -> list:
    """Move the items that name the class token from `items` to `with_class`; keep the rest."""
    with_class += [i for i in items if CLASS in json.dumps(i)]
    return [i for i in items if CLASS not in json.dumps(i)]


def generate() -> str:
    sys.path.insert(0, str(ROOT))
    from core.policy.tenants import Tenant
    from laneway.nats_config import (
        SERVICE_ACCOUNT,
        accounts,
        tenant_account,
        tenant_classes,
        tenant_exports,
        user_names,
    )
    from laneway.nats_permissions import ROLES, user_name
    from schemas.subjects import Subjects

    s = Subjects(PREFIX)
    layout = accounts(s, [Tenant(name=TENANT, classes=[CLASS])], dict.fromkeys(user_names([TENANT]), ""))
    service, tenant = layout[SERVICE_ACCOUNT], _without_passwords(layout[tenant_account(TENANT)])
    assert service["exports"] == tenant_exports(s, TENANT, [CLASS]), "exports are per tenant"
    class_exports, class_imports, class_publish = [], [], []
    exports = _split(service["exports"], class_exports)
    tenant["imports"] = _split(tenant["imports"], class_imports)
    publish = tenant["users"][0]["permissions"]["publish"]
    publish["allow"] = _split(publish["allow"], class_publish)
    spec = {
        "prefix": PREFIX,
        "tenant_token": TENANT,
        "class_token": CLASS,
        "default_classes": list(tenant_classes([TENANT])[TENANT]),
        "roles": {role: user_name(role) for role in ROLES},
        "service_account": {"name": SERVICE_ACCOUNT, **_without_passwords({**service, "exports": []})},
        "tenant_exports": exports,
        "tenant_account": {"name": tenant_account(TENANT), **tenant},
        "tenant_class_exports": class_exports,
        "tenant_class_imports": class_imports,
        "tenant_class_publish": class_publish,
    }
    return json.dumps(spec, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(generate())
    print(f"wrote {OUT.relative_to(ROOT)}")
