"""`laneway classes list|set` and `laneway tenants list|set`: change priority classes and tenants
live through KV. Every process watches the buckets, so a change applies without a restart; a
document is validated here first, and each process validates again before applying it.

    laneway classes set batch --max-slot-share 0.8 --starve-after 20
    laneway classes set --file batch.json
    laneway tenants set acme --weight 3 --default-class standard
    laneway tenants set --file acme.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import msgspec
import nats
import nats.js.errors
from nats.js.kv import KeyValue

from core.connect import connect_once
from core.kvwatch import current_keys
from core.policy import classes as class_docs
from core.policy import tenants as tenant_docs
from core.topology import ensure_intake
from laneway.flags import nats_from_args, ops_nats_flags

_CLASS_FLAGS = {
    "rank": int,
    "max_queue_wait_s": float,
    "max_tenant_depth": int,
    "max_slot_share": float,
    "starve_after_s": float,
    "max_prefill_share": float,
    "max_tenant_share": float,
    "max_tenant_step_share": float,
}
_FLAG_NAMES = {
    "rank": "--rank",
    "max_queue_wait_s": "--max-queue-wait",
    "max_tenant_depth": "--max-tenant-depth",
    "max_slot_share": "--max-slot-share",
    "starve_after_s": "--starve-after",
    "max_prefill_share": "--max-prefill-share",
    "max_tenant_share": "--max-tenant-share",
    "max_tenant_step_share": "--max-tenant-step-share",
}
_TENANT_FLAGS = {"weight": float, "default_class": str}


def configure_classes(parser: argparse.ArgumentParser) -> None:
    ops_nats_flags(parser)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every class and its policy")
    p = sub.add_parser("set", help="create or change a class")
    p.add_argument("name", nargs="?")
    p.add_argument("--file", help="a JSON class document")
    for field, kind in _CLASS_FLAGS.items():
        p.add_argument(_FLAG_NAMES[field], dest=field, type=kind)
    parser.set_defaults(bucket="classes")


def configure_tenants(parser: argparse.ArgumentParser) -> None:
    ops_nats_flags(parser)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every tenant (key hashes only)")
    p = sub.add_parser("set", help="create or change a tenant")
    p.add_argument("name", nargs="?")
    p.add_argument("--file", help="a JSON tenant document")
    p.add_argument("--weight", type=float)
    p.add_argument("--default-class", dest="default_class")
    p.add_argument("--classes", nargs="+")
    p.add_argument("--add-key-sha256", dest="add_key", help="add an API key's SHA-256 hex")
    parser.set_defaults(bucket="tenants")


class UsageError(ValueError):
    pass


def _document(args: argparse.Namespace, current: dict | None) -> tuple[str, bytes]:
    """The new document: a file, or the current one (or defaults) with the flags applied."""
    if args.file:
        with open(args.file, "rb") as f:
            raw = f.read()
        try:
            name = json.loads(raw)["name"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{args.file}: a JSON document with a 'name' field") from None
        return name, raw
    if not args.name:
        raise UsageError("give a NAME or --file")
    doc = dict(current or {"name": args.name})
    flags = _CLASS_FLAGS if args.bucket == "classes" else _TENANT_FLAGS
    for field in flags:
        value = getattr(args, field, None)
        if value is not None:
            doc[field] = value
    if args.bucket == "tenants":
        if args.classes:
            doc["classes"] = args.classes
        if args.add_key:
            doc["api_key_sha256"] = sorted(set(doc.get("api_key_sha256", [])) | {args.add_key.lower()})
    return args.name, json.dumps(doc).encode()


def _validate(bucket: str, name: str, raw: bytes) -> bytes:
    decode = class_docs.decode if bucket == "classes" else tenant_docs.decode
    encode = class_docs.encode if bucket == "classes" else tenant_docs.encode
    return encode(decode(name, raw))  # raises BadClassPolicy / BadTenant (ValueError), naming the field


async def _read(kv: KeyValue, key: str) -> dict:
    """The document under `key`, decoded from its JSON."""
    entry = await kv.get(key)
    assert entry.value is not None  # a get's entry carries its message's data
    return json.loads(entry.value)


async def _run(args: argparse.Namespace) -> int:
    n = nats_from_args(args)
    nc = await connect_once(n, "laneway-config")
    try:
        kv = await nc.jetstream().key_value(n.subjects.bucket(args.bucket))
        if args.action == "list":
            for key in await current_keys(kv):
                print(json.dumps(await _read(kv, key)))
            return 0
        current = None
        if args.name and not args.file:
            try:
                current = await _read(kv, args.name)
            except nats.js.errors.KeyNotFoundError:
                current = None
        name, raw = _document(args, current)
        value = _validate(args.bucket, name, raw)
        # Its intake first (consumers; a tenant's subjects on the request stream): the brokers pull
        # it once they see the document, and a tenant's first request finds a stream.
        mine = [name]
        if args.bucket == "classes":
            await ensure_intake(nc.jetstream(), n.subjects, classes=mine)
        else:
            await ensure_intake(nc.jetstream(), n.subjects, tenants=mine)
        revision = await kv.put(name, value)
        print(f"{args.bucket[:-1]} {name} set (revision {revision}); applied live by every process")
        return 0
    finally:
        await nc.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except (UsageError, ValueError, msgspec.DecodeError, OSError) as exc:
        print(f"laneway {args.bucket}: {exc}", file=sys.stderr)
        return 2
    except nats.js.errors.BucketNotFoundError:
        print(f"laneway {args.bucket}: no {args.bucket} bucket: run `laneway ops provision` first", file=sys.stderr)
        return 2
