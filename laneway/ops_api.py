"""What `laneway batches` and `laneway files` share: the OpenAI client for the bridge their flags
name, one translation of the client's errors into a message and an exit status, and the plain
table and times they print."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TextIO

import openai

from laneway.flags import api_flags, api_key_from_args, base_url_from_args

USAGE = 2  # argparse's status for a command line that cannot work
# The HTTP client logs every request at INFO; a command's output is its answer, not its traffic.
CLIENT_LOGGERS = ("httpx", "httpx2", "openai")


class NoApiKey(Exception):
    pass


def action(
    sub: argparse._SubParsersAction,
    name: str,
    help: str,
    run: Callable[[argparse.Namespace], int],
    object_id: str | None = None,
) -> argparse.ArgumentParser:
    """One subcommand (`laneway files delete FILE_ID`): its parser, taking the id of the object it
    acts on if it names one, and the bridge's flags."""
    p = sub.add_parser(name, help=help)
    if object_id:
        p.add_argument(object_id)
    api_flags(p)
    p.set_defaults(action_run=run)
    return p


def client(args: argparse.Namespace, max_retries: int = 2) -> openai.OpenAI:
    key = api_key_from_args(args)
    if key is None:
        raise NoApiKey("no API key: pass --api-key, set LANEWAY_API_KEY, or run `laneway up` with this --data-dir")
    return openai.OpenAI(base_url=args.base_url, api_key=key, max_retries=max_retries, timeout=30.0)


def guarded(command: str, action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`action` with the client's failures said in one line on stderr: what the bridge answered
    (its status and OpenAI error message), or why it could not be reached."""

    def run(args: argparse.Namespace) -> int:
        for name in CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
        args.base_url = base_url_from_args(args)
        try:
            return action(args)
        except NoApiKey as exc:
            print(f"laneway {command}: {exc}", file=sys.stderr)
            return USAGE
        except openai.APIStatusError as exc:
            message = exc.body.get("message", exc.message) if isinstance(exc.body, dict) else exc.message
            print(f"laneway {command}: the bridge answered {exc.status_code}: {message}", file=sys.stderr)
            return 1
        except openai.APIConnectionError as exc:
            print(
                f"laneway {command}: cannot reach the bridge at {args.base_url}: {exc.__cause__ or exc}",
                file=sys.stderr,
            )
            return 1
        except OSError as exc:  # a local file to read or write
            print(f"laneway {command}: {exc}", file=sys.stderr)
            return 1

    return run


def when(epoch: int | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def write_table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out.write("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def write_json(obj: openai.BaseModel, out: TextIO) -> None:
    out.write(obj.model_dump_json(indent=2, exclude_unset=True) + "\n")
