"""The keys `laneway up` serves with, kept in its data dir: the demo tenant's API key and the
settings file that admits it, which key the banner shows under a settings file of the operator's,
and the bridge's Idempotency-Key secret.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from core import env
from core.natsd import encryption_key
from core.policy.tenants import Tenant, hash_key
from core.settings import Settings
from laneway.flags import DEMO_KEY_FILE
from laneway.nats_config import write_private


def settings_toml(settings: Settings) -> str:
    lines = []
    for name, tenant in settings.tenants.items():
        lines += [
            f"[tenants.{name}]",
            f"api_key_sha256 = {tenant.api_key_sha256!r}".replace("'", '"'),
            f'default_class = "{tenant.default_class}"',
            "",
        ]
    for name, model in settings.models.items():
        lines += [f'[models."{name}"]', f'pool = "{model.pool}"', ""]
    return "\n".join(lines)


def demo_key(data_dir: Path, requested: str | None) -> tuple[str, str, bool]:
    """(the demo tenant's key, a note, whether it differs from the last run's). A generated key
    is kept in the data dir (0600), so `up` again on the same data dir keeps the same key."""
    path = data_dir / DEMO_KEY_FILE
    previous = path.read_text().strip() if path.is_file() else None
    key = requested or previous or f"lw-{secrets.token_urlsafe(24)}"
    if key != previous:
        write_private(path, key + "\n")
    if requested:
        note = ""
    elif previous:
        note = f"  (the last run's, from {path}; pass --api-key to choose one)"
    else:
        note = f"  (generated, kept in {path}; pass --api-key to choose one)"
    return key, note, previous is not None and key != previous


def settings_key(path: Path, tenants: dict[str, Tenant], api_key: str | None) -> tuple[str, str]:
    """(the key the banner shows, a note): with a settings file the tenants' keys are its own,
    so a key is shown only if --api-key names one of them; never a key that would get 401."""
    if api_key is not None:
        owner = next((t.name for t in tenants.values() if hash_key(api_key) in t.api_key_sha256), None)
        if owner is not None:
            return api_key, f"  (tenant {owner})"
        print(f"laneway: --api-key is not a key of any tenant in {path}: it would get 401", file=sys.stderr)
    return "$LANEWAY_API_KEY", f"  (a key of a tenant in {path})"


IDEMPOTENCY_KEY_FILE = "idempotency.key"


def bridge_secrets(data_dir: Path) -> dict[str, str]:
    """The bridge's HMAC key for Idempotency-Key request ids: made once and kept in the data dir
    (0600) as the JetStream key is, so a restarted bridge maps a client's retry to the same id."""
    return {env.IDEMPOTENCY_SECRET.name: encryption_key(data_dir / IDEMPOTENCY_KEY_FILE)}
