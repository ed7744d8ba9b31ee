"""`laneway ops provision`: the streams, the broker's durable consumer, the live buckets and the
settings file's tenants, models and prices, in one run that exits (a compose one-shot service, a
Kubernetes Job or init container). Run it as the ops user (LANEWAY_NATS_USER/PASSWORD); the
services wait for it.

    laneway ops provision --settings deploy/settings.toml --replicas 3
    laneway ops provision --settings deploy/settings.toml --overwrite    # the file wins over KV

Without --overwrite a settings document is written only where KV never had the key, so a second
run never undoes an operator's live edit or delete (core/provision.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import nats.errors

from core import env
from core.provision import not_ready_yet, provision_at
from core.settings import BadSettings, Settings, load_settings
from core.tasks import pause
from core.topology import StorageRefused, StreamLimits
from laneway.flags import nats_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    """Its own flags; the NATS and stream-limit flags are the CLI's shared ones."""
    parser.add_argument(
        "--settings",
        default=env.SETTINGS.get(),
        help="settings TOML: tenants, models, prices to put into KV [LANEWAY_SETTINGS]",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write the settings file over KV (default: only the keys KV never had)"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to keep retrying while NATS or JetStream is not up yet (a cluster starting beside this run)",
    )


async def _provision(args: argparse.Namespace, limits: StreamLimits, settings: Settings) -> None:
    """A run is idempotent, so the whole of it is retried while NATS is still starting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.wait
    while True:
        try:
            return await provision_at(nats_from_args(args), limits, settings, overwrite=args.overwrite)
        except Exception as exc:
            if not not_ready_yet(exc) or loop.time() >= deadline:
                raise
            print(f"laneway ops provision: NATS not ready ({type(exc).__name__}: {exc}); retrying", file=sys.stderr)
            await pause(1.0)


def run(args: argparse.Namespace, limits: StreamLimits) -> int:
    try:
        settings = load_settings(Path(args.settings)) if args.settings else Settings()
        asyncio.run(_provision(args, limits, settings))
    except BadSettings as exc:
        print(f"laneway ops provision: {exc}", file=sys.stderr)
        return 2
    except (nats.errors.Error, OSError) as exc:  # unreachable, refused, or not allowed
        print(f"laneway ops provision: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except StorageRefused as exc:
        print(f"laneway ops provision: {exc}", file=sys.stderr)
        return 1
    print(
        f"provisioned prefix {args.prefix!r}: streams, buckets, {len(settings.tenants)} tenants, "
        f"{len(settings.models)} models" + (" (settings written over KV)" if args.overwrite else "")
    )
    return 0
