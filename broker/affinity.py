"""Where a prompt's prefix is likely cached, and which worker should therefore take it. No I/O.

An engine's prefix cache skips the prefill of a prompt's leading blocks it has computed before,
but only on the worker that computed them. The scheduler remembers what it sent where: each
prompt's text is cut into chunks of ~64 tokens, hashed in a chain (a chunk's hash names the whole
prefix up to it, as vLLM's block hashes do) starting from the tenant scope's cache salt, so two
tenant scopes never share an entry and affinity is no timing channel between them. Each worker's
entries live in an LRU as large as its KV cache, as its engine's freed blocks are reused.

Why the scheduler's memory rather than the engines' KV events: it works for every engine that
reports a KV size (the sim, vLLM) with no new subject, stream or worker-side code, and it knows a
prefix the moment it is dispatched, where an event arrives after the prefill it reports (the next
turn of a fast session would race it). It is approximate: text, not tokens, and an engine may
evict sooner under preemption; a wrong guess costs one prefill, as no affinity does. A scheduler
that takes over starts empty and re-learns from its own dispatches: each live session's next turn
is placed by load alone (a hit 1 time in N workers), the turns after it where it went.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CHUNK_CHARS = 256  # ~64 tokens at the ~4 characters a token estimates use
CHUNK_TOKENS = CHUNK_CHARS // 4
MAX_CHUNKS = 256  # ~16K tokens: a longer prompt's affinity is its first 16K (bounded work)
BALANCE = 0.2  # a worker this far above the others (load, or share of dispatches) is passed over
BALANCE_FLOOR = 1 / 16  # ... or this part of its slots more than the least loaded, whichever is larger
SHARE_HALF_LIFE_S = 20.0  # how fast a worker's recent share of the dispatches forgets
FORGET_AFTER_S = 60.0  # a worker not heard from in this long holds nothing
# What a loaded LoRA adapter is worth in a backlog's order, in prompt tokens: loading one takes an
# engine hundreds of milliseconds (from disk, in its step), several long prefills' worth.
ADAPTER_TOKENS = 8192


def balance_slack(least: int, slots: int) -> float:
    """How many sequences above the least loaded worker (`least`) a worker of `slots` may hold: in
    `choose` and in a batch (broker/balance.py)."""
    return max(1, BALANCE * least, BALANCE_FLOOR * slots)


def prefix_hashes(texts: Iterable[str], salt: str) -> tuple[int, ...]:
    """Chained hashes of the prompt's full chunks; the first chunk's hash includes the salt."""
    text = "".join(texts)
    out: list[int] = []
    parent: object = salt
    for start in range(0, min(len(text) - CHUNK_CHARS + 1, MAX_CHUNKS * CHUNK_CHARS), CHUNK_CHARS):
        parent = hash((parent, text[start : start + CHUNK_CHARS]))
        out.append(parent)
    return tuple(out)


class _Worker:
    __slots__ = ("chunks", "capacity", "adapters", "seen", "rate", "rate_at")

    def __init__(self) -> None:
        self.chunks: OrderedDict[int, None] = OrderedDict()
        self.capacity = 0
        self.adapters: frozenset[str] = frozenset()  # LoRA adapters its last credit said it holds
        self.seen = 0.0
        self.rate = 0.0  # dispatches, exponentially decayed (SHARE_HALF_LIFE_S)
        self.rate_at = 0.0

    def decayed(self, now: float) -> float:
        return self.rate * 0.5 ** ((now - self.rate_at) / SHARE_HALF_LIFE_S)


class PrefixIndex:
    """Per worker of one pool: the prefix chunks it was last sent, least recently used first."""

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}

    def __len__(self) -> int:
        return sum(len(w.chunks) for w in self._workers.values())

    def heard(self, worker: str, kv_tokens: int, now: float, adapters: Iterable[str] = ()) -> None:
        """A worker pulled: it lives, its cache holds `kv_tokens` (0: unknown, nothing kept), and
        it holds these LoRA adapters loaded."""
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker()
        w.seen, w.capacity, w.adapters = now, max(0, kv_tokens // CHUNK_TOKENS), frozenset(adapters)
        self._trim(w)

    def record(self, worker: str, prefix: Sequence[int], now: float) -> None:
        """A request was dispatched to the worker: counted in its share, its prefix kept."""
        w = self._workers.get(worker)
        if w is None:
            return
        w.rate, w.rate_at = w.decayed(now) + 1.0, now
        if not w.capacity:
            return
        # Tail first, so the head is the most recent: eviction takes a prompt's tail before its
        # head (a chain is only found from its head), as vLLM frees a sequence's blocks.
        for h in reversed(prefix):
            w.chunks[h] = None
            w.chunks.move_to_end(h)
        self._trim(w)

    def overlap(self, worker: str, prefix: Sequence[int]) -> int:
        """Prompt tokens of `prefix` the worker likely holds (leading chunks only: a chain)."""
        w = self._workers.get(worker)
        if w is None or not prefix or not w.chunks:
            return 0
        n = 0
        for h in prefix:
            if h not in w.chunks:
                break
            n += 1
        return n * CHUNK_TOKENS

    def best_elsewhere(self, worker: str, prefix: Sequence[int], now: float) -> int:
        """The most of `prefix` any other live worker holds."""
        if not prefix:
            return 0
        return max(
            (
                self.overlap(name, prefix)
                for name, w in self._workers.items()
                if name != worker and now - w.seen < FORGET_AFTER_S
            ),
            default=0,
        )

    def adapter_elsewhere(self, worker: str, adapter: str, now: float) -> bool:
        """Whether another live worker holds the adapter loaded."""
        return any(
            adapter in w.adapters
            for name, w in self._workers.items()
            if name != worker and now - w.seen < FORGET_AFTER_S
        )

    def share(self, worker: str, now: float) -> float:
        """The worker's recent dispatches over the live workers' mean (1.0: its fair part). Sessions
        stay where their history is, so this is how a pool keeps from piling onto one worker."""
        live = [w for w in self._workers.values() if now - w.seen < FORGET_AFTER_S]
        w = self._workers.get(worker)
        total = sum(x.decayed(now) for x in live)
        if w is None or len(live) < 2 or total <= 0:
            return 1.0
        return w.decayed(now) * len(live) / total

    def forget_silent(self, now: float) -> list[str]:
        """Drop workers not heard from in FORGET_AFTER_S (gone, or restarted with a cold cache)."""
        gone = [name for name, w in self._workers.items() if now - w.seen >= FORGET_AFTER_S]
        for name in gone:
            del self._workers[name]
        return gone

    @staticmethod
    def _trim(w: _Worker) -> None:
        while len(w.chunks) > w.capacity:
            w.chunks.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Offer:
    """A worker with room, as the scheduler sees it when choosing where a request goes."""

    worker: str
    load: int  # sequences it holds (running and accepted)
    pending_prefill: int  # prompt tokens it accepted and has not started
    share: float = 1.0  # its recent share of the dispatches (PrefixIndex.share)
    slots: int = 0  # sequences it can hold
    step_tokens: int = 0  # tokens one engine step computes (0: not known)


def choose(
    offers: Sequence[Offer], prompt_tokens: int, overlaps: Sequence[int], unloaded: Sequence[bool] | None = None
) -> int:
    """The index of the offer that should take a request. Among workers within the balance, one
    that holds the request's LoRA adapter loaded (`unloaded[i]`: it would load it first), the
    fewest engine steps of prefill before its first token (its own uncached part after what the
    worker has queued: prompts that share a step cost it nothing), then the least uncached
    prefill (what the pool computes again), then the least loaded, the least share of recent
    dispatches, and the first (the longest parked).

    The balance: not more than BALANCE above the least loaded (or 1/16 of its slots: a few more
    sequences in a step cost a first token far less than a prefill), and, while it is busier than
    the least loaded, not above 1 + BALANCE of its share of recent dispatches. Sessions stay where
    their history is, so the share is how a pool keeps a hot prefix from piling onto one worker;
    a worker no busier than the rest keeps its sessions, as moving them would gain nothing."""
    least = min(o.load for o in offers)
    within = [o.load <= least + balance_slack(least, o.slots) for o in offers]
    balanced = [w and (o.load <= least or o.share <= 1 + BALANCE) for w, o in zip(within, offers, strict=True)]
    if not any(balanced):
        balanced = within
    best, best_key = 0, None
    for i, (offer, cached) in enumerate(zip(offers, overlaps, strict=True)):
        if not balanced[i]:
            continue
        uncached = max(0, prompt_tokens - cached)
        before = uncached + offer.pending_prefill
        steps = -(-before // offer.step_tokens) if offer.step_tokens else before
        key = (unloaded[i] if unloaded else False, steps, uncached, offer.load, offer.share)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best
