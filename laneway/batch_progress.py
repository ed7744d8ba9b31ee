"""The progress line of `laneway batches watch`: lines done of the total, failed, rate and time
left, as pip draws a download. `Rate` and `line` are pure (time is passed in); `Screen` writes the
line, redrawn in place on a terminal, as plain lines now and then into a pipe or a CI log.

No progress library: one line of text does not earn a dependency the base install lacks."""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import TextIO

WINDOW_S = 30.0  # the rate is measured over the last half minute: it follows a batch that speeds up
UNICODE_BAR, ASCII_BAR = "━╺─", "#>-"  # done, half a cell, to do


@dataclass(frozen=True, slots=True)
class Counts:
    total: int
    completed: int
    failed: int

    @property
    def done(self) -> int:
        return self.completed + self.failed


class Rate:
    """Lines finished per second over the last `WINDOW_S`, from the counts as they were seen."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.seen: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        self.seen.append((now, done))
        while len(self.seen) > 2 and now - self.seen[1][0] >= self.window_s:
            self.seen.popleft()

    def per_s(self) -> float | None:
        """None until two sightings a moment apart: no rate is better than a wild one."""
        if len(self.seen) < 2:
            return None
        (t0, n0), (t1, n1) = self.seen[0], self.seen[-1]
        return (n1 - n0) / (t1 - t0) if t1 - t0 >= 0.5 else None


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def line(status: str, counts: Counts, rate: float | None, bar_width: int, cells: str = UNICODE_BAR) -> str:
    """`in_progress ━━━━━━╺━━━━━━━━━  41% 123/300 lines, 2 failed  45.2 lines/s  eta 0:00:04`;
    with `bar_width` 0, no bar (plain log lines)."""
    frac = counts.done / counts.total if counts.total else 0.0
    parts = [f"{status:<11}"]
    if bar_width:
        parts.append(bar(frac, bar_width, cells))
    total = str(counts.total) if counts.total else "?"
    parts.append(f"{frac:4.0%} {counts.done}/{total} lines, {counts.failed} failed")
    if rate is not None:
        parts.append(f"{rate:.1f} lines/s")
        left = counts.total - counts.done
        if counts.total and left and rate > 0:
            parts.append(f"eta {clock(left / rate)}")
    return "  ".join(parts)


def bar(frac: float, width: int, cells: str = UNICODE_BAR) -> str:
    done, half, todo = tuple(cells)  # three one-character strings
    filled = int(frac * width)
    head = half if filled < width and frac * width - filled >= 0.5 else ""
    return done * filled + head + todo * (width - filled - len(head))


def columns(stream: TextIO) -> int:
    """The terminal's width where the line is drawn (stderr's, whatever stdout is piped into)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80


class Screen:
    """Where the line goes. On a terminal each line replaces the last (`\\r`, clear to the end);
    elsewhere a line is written when the status changes, or the counts did and `every_s` passed."""

    def __init__(self, stream: TextIO, width: int | None = None, every_s: float = 10.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.width = width or columns(stream)
        self.cells = UNICODE_BAR if "utf" in (getattr(stream, "encoding", None) or "").lower() else ASCII_BAR
        self.every_s = every_s
        self.last: tuple[float, str, int] | None = None  # (when, status, done) last written

    def show(self, now: float, status: str, counts: Counts, rate: float | None) -> None:
        if self.tty:
            bar_width = max(0, min(40, self.width - 85))
            text = line(status, counts, rate, bar_width, self.cells)[: self.width - 1]
            self.stream.write("\r" + text + "\x1b[K")
        else:
            if self.last is not None:
                when, was, done = self.last
                if status == was and (counts.done == done or now - when < self.every_s):
                    return
            self.stream.write(line(status, counts, rate, 0) + "\n")
        self.last = (now, status, counts.done)
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last is not None:
            self.stream.write("\n")
            self.stream.flush()
