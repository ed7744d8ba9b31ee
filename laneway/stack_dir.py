"""What `laneway up` keeps in its data dir about the stack it runs, and how the operator commands
on the same machine find that stack there: no `export` that goes stale at the next restart.

- `owner.lock`: `up` holds it (core/owner.py) from before it writes anything until the last
  process it started has ended; a second `up` on the data dir is refused, naming the first. Its
  record names up's pid, the bridge's URL, the NATS URL and the ops user's credentials file.
- `nats-port`: the NATS port of the first start, asked for again at each start, so the NATS URL
  stays the same across restarts as long as nothing else has taken the port.

Here, in the CLI, because only `up` writes these and only the CLI's commands read them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from core.owner import DirInUse, Owner, OwnerLock, held_by
from core.ports import free_port, port_taken
from laneway.nats_config import write_private
from laneway.nats_permissions import user_name

LOCK_FILE = "owner.lock"
NATS_PORT_FILE = "nats-port"
STORE_DIR = "nats"  # the JetStream store's directory (core/natsd.py locks it too)
ENDED_OWNER_WAIT_S = 60.0  # a SIGKILLed `up`'s children draining (a worker's --drain-timeout is 30)


async def claim(data_dir: Path, url: str) -> OwnerLock:
    """Own `data_dir` for this `up` (serving `url`), or raise `core.owner.DirInUse`: also when a
    live process (a `laneway nats`) owns its store, said before `up` writes anything."""
    lock = OwnerLock(data_dir / LOCK_FILE)
    await lock.own(Owner(pid=os.getpid(), url=url), ENDED_OWNER_WAIT_S)
    store = data_dir / STORE_DIR / LOCK_FILE
    if (holder := held_by(store)) is not None and holder.alive():
        lock.release()
        raise DirInUse(store, holder, alive=True)
    return lock


def running(data_dir: Path) -> Owner | None:
    """The stack running on `data_dir` (`up`, else a bare `laneway nats`), None when none is."""
    for path in (data_dir / LOCK_FILE, data_dir / STORE_DIR / LOCK_FILE):
        if (owner := held_by(path)) is not None and owner.nats_url:
            return owner
    return None


def ops_login(owner: Owner) -> tuple[str, str] | None:
    """(user, password) of the ops user of a running `up`; None when it runs NATS without users."""
    if not owner.credentials:
        return None
    user = user_name("ops")
    return user, json.loads(Path(owner.credentials).read_text())[user]


def nats_port(data_dir: Path, host: str, requested: int) -> tuple[int, str]:
    """(the port NATS gets, a warning or ""): `requested` if not 0, else the one kept in the data
    dir while it is free, else a new one. The port NATS gets is kept for the next start."""
    path = data_dir / NATS_PORT_FILE
    try:
        kept = int(path.read_text())
    except (OSError, ValueError):
        kept = 0
    note = ""
    if requested:
        port = requested
    elif kept and (taken := port_taken(host, kept)) is None:
        port = kept
    else:
        port = free_port()
        if kept:
            note = (
                f"the NATS port of the last run is taken ({taken}): NATS moves to {port}, kept from "
                "now on; a LANEWAY_NATS_URL exported before is stale (the operator commands on this "
                "machine find NATS from the data dir without it)"
            )
    if port != kept:
        write_private(path, f"{port}\n")
    return port, note
