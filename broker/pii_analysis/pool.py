"""The analyzer pool: spawned worker processes, warmed at start, fed chunks of text.

Presidio holds the GIL for 5–600 ms per call, so it runs in processes (threads would stall the
broker's event loop). Long text is cut at line/sentence breaks into pieces balanced across the
workers, each piece carrying a short lead-in and lead-out so context words and entities at a
cut are still seen. Each tenant's jobs hold at most its share of the processes (`broker/share.py`):
a tenant's long text is cut into at most that many jobs, and its next analysis waits for one of
them to end, so another tenant's job never queues behind a flood. A call that outlives its timeout raises `PiiUnavailable` (the gate fails closed unless the
tenant says otherwise); a dead worker or a wedged one gets the whole pool replaced.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Literal

import broker.pii_analysis.worker as worker
from broker.pii_analysis.plan import Hit, Plan, plan_for
from broker.pii_analysis.spacy_model import DEFAULT_MODEL, model_installed
from broker.share import TenantShare, default_share
from core.policy.pii import Action, TenantPiiPolicy
from core.policy.pii.errors import PiiUnavailable

log = logging.getLogger("laneway.gate")

LEAD_CHARS = 120  # context read on each side of a chunk's cuts (>= NER window + context words)
Job = tuple[list[list[Hit]], float]  # a worker's answer: findings per piece, CPU seconds
_WARM_TEXT = (
    "Maria Garcia (maria.garcia@example.com, +1 415 555 0132) paid with 4111 1111 1111 1111 "
    "from 192.168.1.20; SSN 078-05-1120. She lives in Boston.\n"
)
_WARM_PLAN = plan_for(TenantPiiPolicy(entities={"LOCATION": Action.redact, "DATE_TIME": Action.redact}))


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class PiiEngine:
    def __init__(
        self,
        *,
        workers: int | None = None,
        ner_model: str | Literal["auto"] | None = "auto",
        split_chars: int = 1500,
        stuck_after_s: float = 30.0,
        share: int | None = None,
    ) -> None:
        if ner_model == "auto":
            ner_model = DEFAULT_MODEL if model_installed() else None
        elif ner_model is not None and not model_installed(ner_model):
            raise ValueError(f"spaCy model {ner_model!r} is not installed")
        self.ner_model = ner_model
        self.workers = workers or default_workers()
        # Jobs of one tenant in the pool at once; None: half the processes, rounded up.
        self.share = TenantShare(share or default_share(self.workers))
        self.split_chars = split_chars
        self.stuck_after_s = stuck_after_s
        self._pool: ProcessPoolExecutor | None = None
        self._warming: asyncio.Task[None] | None = None
        # Each job in the pool: when it was submitted (a wedged worker shows as an old one) and the
        # tenant whose share it holds until it ends.
        self._inflight: dict[Future[Job], tuple[float, str]] = {}
        self._inflight_lock = threading.Lock()  # futures complete on the pool's thread
        self.restarts = 0

    @property
    def mode(self) -> Literal["ner", "regex"]:
        return "ner" if self.ner_model else "regex"

    async def start(self) -> None:
        self._pool = self._spawn()
        await self._warm(self._pool)

    async def close(self, grace_s: float = 1.0) -> None:
        """Stop the workers: they hold no state, so one that has not exited after `grace_s`
        (interpreter teardown of spaCy takes seconds on a busy host) is killed."""
        pool, self._pool = self._pool, None
        if self._warming is not None:
            self._warming.cancel()
        if pool is not None:
            procs = list((pool._processes or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(_reap, procs, grace_s)

    def _spawn(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),  # fork would copy the event loop's state
            initializer=worker.init,
            initargs=(self.ner_model, os.getpid()),
        )

    async def _warm(self, pool: ProcessPoolExecutor) -> None:
        """Run one analysis in every worker: imports, model load and first-call costs are paid
        here, not by the first requests. A worker that is busy holding a warm call cannot take
        another, so rounds of `workers` concurrent calls reach every process."""
        loop = asyncio.get_running_loop()
        seen: set[int] = set()
        for _ in range(5):
            calls = [loop.run_in_executor(pool, worker.warm, _WARM_PLAN, _WARM_TEXT, 0.2) for _ in range(self.workers)]
            seen.update(await asyncio.gather(*calls))
            if len(seen) >= self.workers:
                return

    def worker_pids(self) -> list[int]:
        # ProcessPoolExecutor exposes no public handle on its processes (3.14 adds kill_workers).
        pool = self._pool
        return list(pool._processes) if pool is not None and pool._processes else []

    async def analyze(
        self, tenant: str, plan: Plan, texts: list[str], timeout_s: float, *, rank: int = 0
    ) -> tuple[list[list[Hit]], float]:
        """Findings per text (offsets in that text), and the CPU milliseconds of the slowest job:
        the latency floor on idle cores. The wait for the tenant's share counts in `timeout_s`.
        Raises `PiiUnavailable`."""
        pool = self._pool
        if pool is None:
            raise PiiUnavailable("the analyzer pool is not running")
        loop = asyncio.get_running_loop()
        units = 0  # taken from the tenant's share and not yet held by a job
        jobs: list[list[Piece]] = []
        try:
            async with asyncio.timeout(timeout_s):
                units = await self.share.take(tenant, self._jobs_for(texts), rank)
                if (current := self._pool) is None:  # replaced (or closed) while this waited
                    raise PiiUnavailable("the analyzer pool is not running")
                pool = current  # never None in the handlers below
                jobs = split(texts, units, self.split_chars)
                futures: list[Future[Job]] = []
                for job in jobs:
                    fut = pool.submit(worker.analyze, plan, [(t, lo, hi) for _, _, t, lo, hi in job])
                    self._hold(fut, tenant, loop)
                    units -= 1
                    futures.append(fut)
                results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except TimeoutError:
            self._restart_if_wedged(pool)
            if not jobs:
                raise PiiUnavailable(
                    f"analysis exceeded {timeout_s * 1000:.0f} ms waiting behind this tenant's own analyses "
                    f"(its share of the pool is {self.share.limit} of {self.workers} processes)"
                ) from None
            raise PiiUnavailable(f"analysis exceeded {timeout_s * 1000:.0f} ms") from None
        except PiiUnavailable:
            raise
        except BrokenProcessPool:
            self._restart(pool)
            raise PiiUnavailable("an analyzer worker died") from None
        except Exception as exc:  # the process boundary: anything a worker raises fails closed
            log.warning("PII analysis failed in a worker", exc_info=True)
            raise PiiUnavailable(f"analysis failed ({type(exc).__name__})") from None
        finally:
            if units:
                self.share.give_back(tenant, units)  # taken, but no job holds them
        return merge(texts, jobs, [r for r, _ in results]), max(c for _, c in results) * 1000

    def _jobs_for(self, texts: list[str]) -> int:
        total = sum(len(t) for t in texts)
        return max(1, min(self.workers, total // self.split_chars))

    def _hold(self, fut: Future[Job], tenant: str, loop: asyncio.AbstractEventLoop) -> None:
        """`fut` holds one unit of the tenant's share until the job ends, in its process: a caller
        that stopped waiting (a timeout, a cancel) does not free the process its job runs in."""
        with self._inflight_lock:
            self._inflight[fut] = (time.monotonic(), tenant)
        fut.add_done_callback(functools.partial(self._ended, loop))

    def _ended(self, loop: asyncio.AbstractEventLoop, fut: Future[Job]) -> None:
        # On the pool's thread (or this one, for a job that ended before the callback was added).
        with self._inflight_lock:
            held = self._inflight.pop(fut, None)
        if held is not None:
            try:
                loop.call_soon_threadsafe(self.share.give_back, held[1])
            except RuntimeError:
                pass  # the loop is closed, and every share with it

    def _restart_if_wedged(self, pool: ProcessPoolExecutor) -> None:
        """A timeout alone may be load; a job running for `stuck_after_s` is a wedged worker."""
        with self._inflight_lock:
            oldest = min((at for at, _ in self._inflight.values()), default=None)
        if oldest is not None and time.monotonic() - oldest > self.stuck_after_s:
            self._restart(pool)

    def _restart(self, pool: ProcessPoolExecutor) -> None:
        if pool is not self._pool:
            return  # another caller already replaced it
        self.restarts += 1
        for proc in list((pool._processes or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        with self._inflight_lock:
            killed, self._inflight = self._inflight, {}
        for _, tenant in killed.values():  # their processes are gone: so are the jobs' units
            self.share.give_back(tenant)
        self._pool = self._spawn()
        self._warming = asyncio.get_running_loop().create_task(self._warm(self._pool))


def _reap(procs: Sequence[multiprocessing.process.BaseProcess], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


# A piece of one text: (text index, offset of the piece in the text, piece, lo, hi); findings
# are reported for [lo, hi) of the piece, the rest is lead-in/lead-out.
Piece = tuple[int, int, str, int, int]


def split(texts: list[str], jobs: int, min_chars: int) -> list[list[Piece]]:
    """Cut texts into pieces and pack them into at most `jobs` balanced jobs (largest first)."""
    if jobs <= 1:
        return [[(i, 0, t, 0, len(t)) for i, t in enumerate(texts)]]
    target = max(min_chars, math.ceil(sum(len(t) for t in texts) / jobs))
    pieces: list[Piece] = []
    for i, text in enumerate(texts):
        pos = 0
        while pos < len(text):
            end = len(text) if len(text) - pos <= target * 1.2 else _cut(text, pos + target)
            a, b = _lead_start(text, pos), _lead_end(text, end)
            pieces.append((i, a, text[a:b], pos - a, end - a))
            pos = end
    bins: list[list[Piece]] = [[] for _ in range(jobs)]
    sizes = [0] * jobs
    for piece in sorted(pieces, key=lambda p: -len(p[2])):
        k = sizes.index(min(sizes))
        bins[k].append(piece)
        sizes[k] += len(piece[2])
    return [b for b in bins if b]


def _cut(text: str, near: int) -> int:
    """A break near `near`: a newline, else a sentence end, else a space; never inside a word."""
    lo, hi = max(1, near - 300), min(len(text), near + 300)
    for sep in ("\n", ". ", " "):
        k = text.rfind(sep, lo, hi)
        if k != -1:
            return k + len(sep)
    return near


def _lead_start(text: str, pos: int) -> int:
    if pos == 0:
        return 0
    k = text.find(" ", max(0, pos - LEAD_CHARS), pos)
    return k + 1 if k != -1 else max(0, pos - LEAD_CHARS)


def _lead_end(text: str, end: int) -> int:
    if end >= len(text):
        return len(text)
    k = text.rfind(" ", end, min(len(text), end + LEAD_CHARS))
    return k if k != -1 else min(len(text), end + LEAD_CHARS)


def merge(texts: list[str], jobs: list[list[Piece]], results: list[list[list[Hit]]]) -> list[list[Hit]]:
    """Job results back to per-text findings. A finding straddling a cut comes from both pieces:
    duplicates go, and so does one contained in another of its type with an equal or higher
    score (Presidio's rule), should the two views differ."""
    out: list[list[Hit]] = [[] for _ in texts]
    split_texts = set()
    for job, found in zip(jobs, results, strict=True):
        for (i, offset, piece, _, _), hits in zip(job, found, strict=True):
            if len(piece) != len(texts[i]):
                split_texts.add(i)
            out[i] += [(e, s + offset, t + offset, sc) for e, s, t, sc in hits]
    for i in split_texts:
        hits = sorted(set(out[i]))
        out[i] = [
            h
            for h in hits
            if not any(o != h and o[0] == h[0] and o[1] <= h[1] and h[2] <= o[2] and h[3] <= o[3] for o in hits)
        ]
    return out
