"""Writes deploy/helm/laneway/files/nats-permissions.json: each role's NATS user and permissions,
as `laneway/nats_config.py` generates them. The chart builds its `authorization` block from this
file (a chart cannot run Python); tests/deploy/test_helm_chart.py fails when it has drifted.

    .venv/bin/python deploy/helm/generate_nats_permissions.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy" / "helm" / "laneway" / "files" / "nats-permissions.json"
PREFIX = "lw"       # the chart runs every process with the default subject prefix


def generate() -> str:
    sys.path.insert(0, str(ROOT))
    from laneway.nats_config import ROLES, service_permissions, user_name
    from schemas.subjects import Subjects

    permissions = service_permissions(Subjects(PREFIX))
    roles = {role: {"user": user_name(role), "permissions": permissions[role]} for role in ROLES}
    return json.dumps({"prefix": PREFIX, "roles": roles}, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(generate())
    print(f"wrote {OUT.relative_to(ROOT)}")
