"""`laneway top`: a live terminal view of the lanes, the workers and the bridges.

It reads what the processes already serve: their Prometheus metrics, at the endpoints of the
scrape config `laneway up` writes into its data dir (laneway/scrape_config.py). Metrics rather
than a NATS subscription: they answer with no NATS login, hold every figure the view shows (the
broker's lanes, each worker's slots and KV, each bridge's stream limit and the clients' TTFT,
which only the bridge sees), and the view then shows what Prometheus and the Grafana board show.
On a terminal the frame is redrawn in place (plain ANSI, no library: q or Ctrl-C quits);
`--once` prints one frame as plain text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from core import env
from core.promtext import Scrape, parse
from core.tasks import wait_event
from laneway.scrape_config import SCRAPE_FILE, BadScrapeConfig, Target, read
from laneway.top_view import Frame, render

SCRAPE_TIMEOUT_S = 2.0
# Alternate screen and hidden cursor while it runs, as htop does; both undone at the end.
ENTER, LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        default=env.DATA_DIR.get(),
        help=f"the data dir of the `laneway up` to watch [{env.DATA_DIR.name}]",
    )
    p.add_argument(
        "--scrape-config",
        metavar="FILE",
        help=f"a Prometheus scrape config with static targets (default DATA_DIR/{SCRAPE_FILE})",
    )
    p.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    p.add_argument("--window", type=float, default=60.0, help="seconds of the TTFT p95 in the live view")
    p.add_argument("--once", action="store_true", help="print one frame as plain text and exit")


async def _scrape(http: aiohttp.ClientSession, target: Target) -> Scrape | str:
    try:
        async with http.get(target.url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return f"HTTP {resp.status}"
            return parse(await resp.text())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except ValueError as exc:  # not Prometheus text
        return f"unreadable metrics: {exc}"


async def frame(http: aiohttp.ClientSession, targets: list[Target]) -> Frame:
    at = time.time()
    scrapes = await asyncio.gather(*(_scrape(http, t) for t in targets))
    return Frame(at, list(zip(targets, scrapes, strict=True)))


@contextlib.contextmanager
def _screen(quit: asyncio.Event) -> Iterator[None]:
    """The alternate screen, and single keys read without Enter (q quits); restored on exit."""
    import termios
    import tty

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    loop = asyncio.get_running_loop()

    def on_key() -> None:
        if sys.stdin.read(1) in ("q", "Q"):
            quit.set()

    if fd is not None:
        tty.setcbreak(fd)
        loop.add_reader(fd, on_key)
    sys.stdout.write(ENTER)
    try:
        yield
    finally:
        sys.stdout.write(LEAVE)
        sys.stdout.flush()
        if fd is not None and saved is not None:  # both or neither
            loop.remove_reader(fd)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _draw(text: str) -> None:
    sys.stdout.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in text.splitlines()) + CLEAR_BELOW)
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> int:
    path = Path(args.scrape_config or Path(args.data_dir) / SCRAPE_FILE)
    if not path.is_file():
        print(
            f"laneway top: no scrape config at {path}: is `laneway up` running with this --data-dir? "
            "(or name one with --scrape-config)",
            file=sys.stderr,
        )
        return 2
    try:
        targets = read(path)
    except BadScrapeConfig as exc:
        print(f"laneway top: {exc}", file=sys.stderr)
        return 2
    if not targets:
        print(f"laneway top: {path} names no static laneway-bridge|broker|worker target", file=sys.stderr)
        return 2
    async with aiohttp.ClientSession() as http:
        if args.once:
            print(render(await frame(http, targets), source=str(path)), end="", flush=True)
            return 0
        await _live(http, path, targets, args)
    return 0


def _reread(path: Path, targets: list[Target]) -> list[Target]:
    """The scrape config again (an `up` started anew chose new ports); the last one read while
    the file is being rewritten or names nothing."""
    try:
        return read(path) or targets
    except BadScrapeConfig:
        return targets


async def _live(http: aiohttp.ClientSession, path: Path, targets: list[Target], args: argparse.Namespace) -> None:
    """A frame every `--interval`: redrawn in place on a terminal, one after another otherwise
    (as `top -b`). The TTFT p95 is over the frames of the last `--window` seconds."""
    quit = asyncio.Event()
    frames: deque[Frame] = deque()
    on_tty = sys.stdout.isatty()
    with _screen(quit) if on_tty else contextlib.nullcontext():
        while not quit.is_set():
            if (fresh := _reread(path, targets)) != targets:
                targets = fresh
                frames.clear()  # counters of other processes: no window across them
            now = await frame(http, targets)
            while frames and frames[0].at < now.at - args.window:
                frames.popleft()
            text = render(now, frames[0] if frames else None, str(path))
            frames.append(now)
            if on_tty:
                _draw(text)
            else:
                print(text, flush=True)
            await wait_event(quit, args.interval)
