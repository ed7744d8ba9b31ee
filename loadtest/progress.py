"""A plain-text progress bar on stderr (no dependency): elapsed, requests, errors, in flight,
tokens/s. Redraws in place on a terminal; prints a line every few seconds otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from loadtest.traffic import Sample, Sampled

WIDTH = 24


class Progress:
    def __init__(
        self, rec: Sampled, total_s: float, label: str = "", stream: TextIO | None = None, every_s: float = 5.0
    ) -> None:
        self.rec = rec
        self.total_s = max(total_s, 1e-9)
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.start = time.time()
        self._last_print = 0.0
        self._last_tokens = (self.start, 0)

    def line(self, sample: Sample) -> str:
        now = sample.t
        elapsed = now - self.start
        frac = min(1.0, elapsed / self.total_s)
        filled = int(frac * WIDTH)
        tokens = self.rec.tokens()
        t_prev, n_prev = self._last_tokens
        rate = (tokens - n_prev) / max(1e-9, now - t_prev)
        self._last_tokens = (now, tokens)
        inflight = sum(sample.inflight.values())
        waiting = sum(sample.waiting.values())
        return (
            f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {frac * 100:3.0f}% "
            f"{elapsed:5.0f}/{self.total_s:.0f}s  sent {self.rec.sent}  err {self.rec.errors}  "
            f"in flight {inflight} (waiting {waiting})  {rate:,.0f} tok/s"
        )

    def __call__(self, sample: Sample) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(sample) + "\x1b[K")
            self.stream.flush()
        elif sample.t - self._last_print >= self.every_s:
            self._last_print = sample.t
            self.stream.write(self.line(sample) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
