"""The SIMULATED engine's scheduler: what vLLM V1 would run in each step. Pure: no I/O, no clock.

Each step has a token budget (`max_num_batched_tokens`). Running sequences are served first, in
the order they started, each with what it still needs (a decode: one token; a partly prefilled
prompt: its next chunk), then waiting sequences by (priority, arrival) take chunks of what is
left. KV cache is counted in blocks of 16 tokens; full prompt blocks are hashed (chained, the
first with the tenant's cache salt) and kept after their sequence ends, so a later prompt that
shares a prefix skips prefilling it, until LRU eviction reuses the block.

Calibration: the rules follow vLLM 0.32 (`.venv/.../vllm/`), file:function —
- step budget, running first then waiting, `long_prefill_token_threshold` per chunk (and not
  when only one request is eligible): `v1/core/sched/scheduler.py:Scheduler.schedule`;
- out of KV for a running sequence: preempt the running one with the largest
  (priority, arrival) under `priority` policy, the last started under `fcfs`; a victim that was
  already scheduled this step gives its tokens back; the loop stops if the victim is the
  sequence itself; no waiting sequence starts in a step that preempted:
  `Scheduler.schedule`, `Scheduler._preempt_request` (recompute: blocks freed, computed = 0,
  back to waiting);
- a waiting sequence that cannot get its blocks stops the waiting loop (no preemption for it):
  `Scheduler.schedule`;
- waiting order (priority, arrival): `v1/request.py:Request.__lt__`,
  `v1/core/sched/request_queue.py:PriorityRequestQueue`;
- prefix hits capped at `num_tokens - 1` (the last token is always computed):
  `v1/core/kv_cache_manager.py:KVCacheManager.get_computed_blocks`; blocks cached at allocation
  for computed + scheduled tokens: `KVCacheManager.allocate_slots`; freed in reverse so tails
  are evicted first: `KVCacheManager.free`; never-used blocks first, then LRU eviction of freed
  ones: `v1/core/block_pool.py:BlockPool.get_new_blocks`; the salt in the first block's hash:
  `v1/core/kv_cache_utils.py:_gen_extra_hash_keys` (`cache_salt`);
- defaults `max_num_batched_tokens` 8192 / 2048, `max_num_seqs`:
  `engine/arg_utils.py:EngineArgs.get_batch_defaults` (H100/H200, ≥ 70 GiB, OpenAI server);
  `long_prefill_token_threshold` 0 and `policy`: `config/scheduler.py:SchedulerConfig`.
Simplified: output tokens' blocks are never hashed (only prompts are shared); no speculative
decoding, LoRA, encoder or KV-connector paths; a preempted sequence re-enters the waiting heap at
its (priority, arrival) place (vLLM's FCFS queue puts it at the front).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

BLOCK = 16  # vLLM's default block_size on GPU (CacheConfig)


def block_hashes(text: str, prompt_tokens: int, salt: str = "") -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks, the sim's ~4 characters a token."""
    out: list[int] = []
    parent: object = salt
    for i in range(prompt_tokens // BLOCK):
        parent = hash((parent, text[i * BLOCK * 4 : (i + 1) * BLOCK * 4]))
        out.append(parent)
    return tuple(out)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int
    long_prefill_token_threshold: int = 0
    policy: Literal["priority", "fcfs"] = "priority"
    max_loras: int = 0  # distinct LoRA adapters in one step at most (0: no LoRA limit)


@dataclass(eq=False)
class Sequence:
    """One sequence as the scheduler sees it; `owner` is the engine's handle."""

    owner: object
    priority: int
    arrival: int
    prompt_tokens: int
    hashes: tuple[int, ...] = ()
    num_tokens: int = 0  # prompt + sampled output
    computed: int = 0  # tokens whose KV is in the cache
    blocks: list[int] = field(default_factory=list)
    hashed: int = 0  # leading blocks registered in the prefix cache
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache, all starts
    adapter: str = ""  # its LoRA adapter ("" for the base model)
    first_hit: int | None = None  # ... at its first start: what vLLM reports (num_cached_tokens)
    done: bool = False

    def __post_init__(self) -> None:
        self.num_tokens = self.num_tokens or self.prompt_tokens

    @property
    def rank(self) -> tuple[int, int]:
        return (self.priority, self.arrival)


@dataclass
class Step:
    scheduled: dict[Sequence, int] = field(default_factory=dict)  # tokens per sequence
    decodes: int = 0  # sequences computing one token past a full prefill
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(self.scheduled.values())

    @property
    def kv_read(self) -> int:
        """KV-cache tokens the step's attention reads: each sequence's context through its new tokens."""
        return sum(seq.computed + n for seq, n in self.scheduled.items())


class BlockPool:
    """KV blocks: never-used ones first (counted, not listed), then freed ones in LRU order.
    A freed block keeps its hash (a cache hit) until it is taken again."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._unused = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict()
        self._refs: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._cached: dict[int, int] = {}  # hash → block

    @property
    def free(self) -> int:
        return self._unused + len(self._free)

    def lookup(self, hashes: tuple[int, ...], limit: int) -> list[int]:
        hits = []
        for h in hashes[:limit]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def take(self, hits: list[int], new: int) -> list[int] | None:
        """Reference `hits` and `new` fresh blocks, or nothing if they do not fit."""
        if new + sum(1 for b in hits if b in self._free) > self.free:
            return None
        for b in hits:
            self._free.pop(b, None)
            self._refs[b] = self._refs.get(b, 0) + 1
        out = []
        for _ in range(new):
            if self._unused:
                self._unused -= 1
                b = self.num_blocks - self._unused - 1
            else:
                b, _ = self._free.popitem(last=False)
                if (h := self._hash_of.pop(b, None)) is not None:
                    del self._cached[h]
            self._refs[b] = 1
            out.append(b)
        return out

    def cache(self, block: int, h: int) -> None:
        if block not in self._hash_of and h not in self._cached:
            self._hash_of[block] = h
            self._cached[h] = block

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                del self._refs[b]
                self._free[b] = None


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_blocks)
        self.running: list[Sequence] = []
        self._waiting: list[tuple[int, int, int, Sequence]] = []
        self._queued = 0  # waiting sequences not done
        self._ties = itertools.count()

    def add(self, seq: Sequence) -> None:
        priority = seq.priority if self.config.policy == "priority" else 0
        heapq.heappush(self._waiting, (priority, seq.arrival, next(self._ties), seq))
        self._queued += 1

    def has_work(self) -> bool:
        return bool(self.running) or self._queued > 0

    def waiting(self) -> int:
        return self._queued

    def schedule(self) -> Step:
        c, step = self.config, Step()
        budget = c.max_num_batched_tokens
        threshold = c.long_prefill_token_threshold if len(self.running) + self._queued > 1 else 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(self._chunk(seq.num_tokens - seq.computed, threshold), budget)
            while not self._allocate(seq, n):
                victim = max(self.running, key=lambda s: s.rank) if c.policy == "priority" else self.running[-1]
                at = self.running.index(victim)
                del self.running[at]
                if at < i:
                    i -= 1
                budget += step.scheduled.pop(victim, 0)
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is seq:
                    break
            else:
                step.scheduled[seq] = n
                budget -= n
                i += 1
                continue
            break
        if not step.preempted:
            budget = self._start_waiting(step, budget, threshold)
        step.decodes = sum(
            1
            for s, n in step.scheduled.items()
            if n == 1 and s.num_tokens > s.prompt_tokens and s.computed == s.num_tokens - 1
        )
        return step

    def _start_waiting(self, step: Step, budget: int, threshold: int) -> int:
        # A step serves at most max_loras adapters: a waiting sequence of another one waits (vLLM's
        # scheduler skips it, keeping its place), those of the running adapters go ahead.
        adapters = {s.adapter for s in self.running if s.adapter}
        skipped = []
        while budget > 0 and self._waiting and len(self.running) < self.config.max_num_seqs:
            seq = self._waiting[0][3]
            if seq.done:
                heapq.heappop(self._waiting)
                continue
            if (
                seq.adapter
                and self.config.max_loras
                and seq.adapter not in adapters
                and len(adapters) >= self.config.max_loras
            ):
                skipped.append(heapq.heappop(self._waiting))
                continue
            hits = self.pool.lookup(seq.hashes, (seq.num_tokens - 1) // BLOCK)
            computed = len(hits) * BLOCK
            n = min(self._chunk(seq.num_tokens - computed, threshold), budget)
            blocks = self.pool.take(hits, self._blocks_for(computed + n) - len(hits))
            if blocks is None:
                break
            heapq.heappop(self._waiting)
            self._queued -= 1
            seq.blocks, seq.computed, seq.hashed = hits + blocks, computed, len(hits)
            seq.cached_tokens += computed
            if seq.first_hit is None:
                seq.first_hit = computed
            self._cache_full_blocks(seq, computed + n)
            self.running.append(seq)
            step.scheduled[seq] = n
            budget -= n
            if seq.adapter:
                adapters.add(seq.adapter)
        for entry in skipped:
            heapq.heappush(self._waiting, entry)
        return budget

    def finish_step(self, step: Step) -> list[Sequence]:
        """Advance the step's sequences; those that computed all their tokens sample one."""
        sampled = []
        for seq, n in step.scheduled.items():
            if seq.done:
                continue
            seq.computed += n
            if seq.computed >= seq.num_tokens:
                seq.num_tokens += 1
                sampled.append(seq)
        return sampled

    def finish(self, seq: Sequence) -> None:
        """The sequence ended (or was aborted): its blocks go back, its hashes stay cached."""
        if seq.done:
            return
        seq.done = True
        if seq in self.running:
            self.running.remove(seq)
        else:
            self._queued -= 1  # still waiting: dropped lazily from the heap
        self.pool.release(seq.blocks)
        seq.blocks = []

    # -- internals ------------------------------------------------------------------------
    @staticmethod
    def _chunk(n: int, threshold: int) -> int:
        return threshold if 0 < threshold < n else n

    @staticmethod
    def _blocks_for(tokens: int) -> int:
        return -(-tokens // BLOCK)

    def _allocate(self, seq: Sequence, n: int) -> bool:
        need = self._blocks_for(seq.computed + n) - len(seq.blocks)
        if need <= 0:
            return True
        blocks = self.pool.take([], need)
        if blocks is None:
            return False
        seq.blocks += blocks
        self._cache_full_blocks(seq, seq.computed + n)
        return True

    def _cache_full_blocks(self, seq: Sequence, tokens: int) -> None:
        upto = min(tokens // BLOCK, len(seq.hashes))
        for i in range(seq.hashed, upto):
            self.pool.cache(seq.blocks[i], seq.hashes[i])
        seq.hashed = max(seq.hashed, upto)

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        seq.blocks, seq.computed, seq.hashed = [], 0, 0
        seq.preemptions += 1
        self.add(seq)
