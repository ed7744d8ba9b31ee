"""`laneway files list | show | upload | download | delete`: a tenant's files on the bridge (the
Files API: batch inputs, batch outputs and error files), with the key of that tenant.

    laneway files upload requests.jsonl            # prints the new file's id
    laneway files list --purpose batch_output
    laneway files download file-abc > out.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from laneway.ops_api import action, client, guarded, when, write_json, write_table

PURPOSES = ("batch", "batch_output", "user_data")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "A tenant's files on the bridge: batch inputs, and the outputs and errors of batches."
    sub = parser.add_subparsers(dest="action", required=True)
    p = action(sub, "list", "the tenant's files, newest first", list_files)
    p.add_argument("--purpose", choices=PURPOSES)
    p.add_argument("--limit", type=int, default=100, help="show at most this many")
    action(sub, "show", "one file's record, as JSON", show, "file_id")
    p = action(sub, "upload", "upload a file; prints its id", upload)
    p.add_argument("path", type=Path)
    p.add_argument("--purpose", choices=("batch", "user_data"), default="batch")
    p = action(sub, "download", "a file's content, to stdout or --output", download, "file_id")
    p.add_argument("-o", "--output", type=Path, help="write it here instead of stdout")
    action(sub, "delete", "delete a file", delete, "file_id")


def run(args: argparse.Namespace) -> int:
    return guarded("files", args.action_run)(args)


def list_files(args: argparse.Namespace) -> int:
    rows: list[tuple[str, ...]] = []
    for f in client(args).files.list(**({"purpose": args.purpose} if args.purpose else {})):
        if len(rows) == args.limit:
            break
        rows.append((f.id, f.purpose, str(f.bytes), when(f.created_at), f.filename))
    if not rows:
        print("no files")
        return 0
    write_table(("ID", "PURPOSE", "BYTES", "CREATED", "FILENAME"), rows, sys.stdout)
    return 0


def show(args: argparse.Namespace) -> int:
    write_json(client(args).files.retrieve(args.file_id), sys.stdout)
    return 0


def upload(args: argparse.Namespace) -> int:
    with args.path.open("rb") as f:
        created = client(args).files.create(file=(args.path.name, f), purpose=args.purpose)
    print(created.id)
    return 0


def download(args: argparse.Namespace) -> int:
    content = client(args).files.content(args.file_id).content
    if args.output is None:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
    else:
        args.output.write_bytes(content)
        print(f"{args.output} ({len(content)} bytes)", file=sys.stderr)
    return 0


def delete(args: argparse.Namespace) -> int:
    deleted = client(args).files.delete(args.file_id)
    print(f"deleted {deleted.id}")
    return 0
