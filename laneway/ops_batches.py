"""`laneway batches list | show | watch | cancel | download`: a tenant's batches on the bridge (the
Batch API), with the key of that tenant.

    laneway batches watch batch_abc      # a progress bar until it ends; exit 1 unless completed
    laneway batches download batch_abc   # batch_abc_output.jsonl and batch_abc_errors.jsonl here

`watch` polls the batch (`--interval`) and draws its request counts: on a terminal one line
redrawn in place, into a pipe a line when the status changes or every ten seconds of progress.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from openai.types import Batch

from laneway.batch_progress import Counts, Rate, Screen
from laneway.flags import positive_float
from laneway.ops_api import action, client, guarded, when, write_json, write_table

ENDED = ("completed", "failed", "expired", "cancelled")
INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "A tenant's batches on the bridge: list them, watch one run, cancel it, fetch its results."
    sub = parser.add_subparsers(dest="action", required=True)
    p = action(sub, "list", "the tenant's batches, newest first", list_batches)
    p.add_argument("--limit", type=int, default=20, help="show at most this many")
    action(sub, "show", "one batch, as JSON", show, "batch_id")
    p = action(sub, "watch", "a progress bar until the batch ends; exit 1 unless it completed", watch, "batch_id")
    p.add_argument("--interval", type=positive_float, default=1.0, help="seconds between looks at the batch")
    action(sub, "cancel", "cancel a batch: lines in flight stop, what finished is kept", cancel, "batch_id")
    p = action(sub, "download", "an ended batch's output and error files", download, "batch_id")
    p.add_argument("--dir", type=Path, default=Path("."), help="write them here (default: the current directory)")


def run(args: argparse.Namespace) -> int:
    return guarded("batches", args.action_run)(args)


def counts_of(batch: Batch) -> Counts:
    c = batch.request_counts
    return Counts(c.total, c.completed, c.failed) if c is not None else Counts(0, 0, 0)


def list_batches(args: argparse.Namespace) -> int:
    rows: list[tuple[str, ...]] = []
    for b in client(args).batches.list(limit=min(max(args.limit, 1), 100)):
        if len(rows) == args.limit:
            break
        c = counts_of(b)
        rows.append((b.id, b.status, str(c.completed), str(c.failed), str(c.total), when(b.created_at), b.endpoint))
    if not rows:
        print("no batches")
        return 0
    write_table(("ID", "STATUS", "COMPLETED", "FAILED", "TOTAL", "CREATED", "ENDPOINT"), rows, sys.stdout)
    return 0


def show(args: argparse.Namespace) -> int:
    write_json(client(args).batches.retrieve(args.batch_id), sys.stdout)
    return 0


def cancel(args: argparse.Namespace) -> int:
    b = client(args).batches.cancel(args.batch_id)
    print(f"{b.id} {b.status}")
    return 0


def watch(args: argparse.Namespace) -> int:
    c = client(args, max_retries=5)  # a bridge restarted by `laneway up` is back within them
    batch = c.batches.retrieve(args.batch_id)
    print(
        f"{batch.id}  {batch.endpoint}  created {when(batch.created_at)}  window {batch.completion_window}",
        file=sys.stderr,
    )
    screen = Screen(sys.stderr)
    rate = Rate()
    try:
        while True:
            now = time.monotonic()
            rate.add(now, counts_of(batch).done)
            screen.show(now, batch.status, counts_of(batch), rate.per_s())
            if batch.status in ENDED:
                break
            time.sleep(args.interval)
            batch = c.batches.retrieve(batch.id)
    except KeyboardInterrupt:
        screen.close()
        print(f"stopped watching; {batch.id} goes on", file=sys.stderr)
        return INTERRUPTED
    screen.close()
    return summary(batch)


def summary(batch: Batch) -> int:
    """The ended batch's status and request counts on stdout, where its files are; 0 if it completed."""
    c = counts_of(batch)
    print(f"{batch.id} {batch.status}: {c.completed} completed, {c.failed} failed, {c.total} total")
    files = [
        f"{name} {fid}" for name, fid in (("output", batch.output_file_id), ("errors", batch.error_file_id)) if fid
    ]
    if files:
        print(f"  {'  '.join(files)}\n  laneway batches download {batch.id}")
    for error in (batch.errors.data or []) if batch.errors else []:
        where = f" (line {error.line})" if error.line is not None else ""
        print(f"  error {error.code}{where}: {error.message}", file=sys.stderr)
    return 0 if batch.status == "completed" else 1


def download(args: argparse.Namespace) -> int:
    c = client(args)
    batch = c.batches.retrieve(args.batch_id)
    if batch.status not in ENDED:
        print(
            f"laneway batches: {batch.id} is {batch.status}; its files are written when it ends "
            f"(laneway batches watch {batch.id})",
            file=sys.stderr,
        )
        return 1
    wanted = [
        (fid, args.dir / f"{batch.id}_{name}.jsonl")
        for name, fid in (("output", batch.output_file_id), ("errors", batch.error_file_id))
        if fid
    ]
    if not wanted:
        print(f"laneway batches: {batch.id} ({batch.status}) has no output or error file", file=sys.stderr)
        return 1
    args.dir.mkdir(parents=True, exist_ok=True)
    for file_id, path in wanted:
        content = c.files.content(file_id).content
        path.write_bytes(content)
        print(f"{path}  {len(content.splitlines())} lines")
    return 0
