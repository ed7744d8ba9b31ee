"""Named load scenarios, from the two reference documents, each scalable down to a laptop.

A scenario is data: who calls (tenants, with fair-share weights), which pools serve which logical
models (simulated engines, labelled as such), and the traffic flows. A flow is either
open-loop (Poisson arrivals at `rate` requests/s: load does not slow down when the system does)
or closed-loop (`users` that each send, wait for the whole reply, think, and send again).

`Scenario.scaled(f)` multiplies rates, users and workers by `f` and keeps the shapes (prompt and
output lengths, think times), so `--scale 0.05` is the same traffic mix at 5% of the volume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

CLASSES = ("interactive", "standard", "batch")


@dataclass(frozen=True)
class Flow:
    name: str  # label in results: chat, flood, ...
    tenant: str
    klass: str  # x-laneway-class
    model: str = "laneway-sim"
    rate: float = 0.0  # open loop: Poisson arrivals, requests/s
    users: int = 0  # closed loop: concurrent users
    think_s: float = 0.0  # closed loop: mean think time (exponential), 0 = back to back
    prompt_tokens: int = 64  # ~4 characters per token, as the broker and sim estimate
    max_tokens: int = 64
    max_tokens_spread: float = 0.0  # max_tokens drawn uniformly in ±spread·max_tokens
    ramp_s: float = 0.0  # closed loop: users start spread over this long
    distinct: bool = False  # each prompt begins with its own tag: no engine prefix-cache hits
    # Open loop: a 429/503 is retried this many times as the OpenAI SDK does (its Retry-After,
    # else exponential backoff), and TTFT counts from the first attempt: what its user waits.
    retries: int = 0

    @property
    def open_loop(self) -> bool:
        return self.rate > 0

    def scaled(self, f: float) -> Flow:
        if self.open_loop:
            return replace(self, rate=self.rate * f)
        return replace(self, users=max(1, round(self.users * f)))


@dataclass(frozen=True)
class TenantSpec:
    name: str
    weight: float = 1.0
    classes: tuple[str, ...] = CLASSES
    default_class: str = "interactive"
    pii: bool = True  # its PII policy: the default one, or off (nothing looked for)
    more: tuple[str, ...] = ()  # more of its document, as TOML lines (`storage.files = 3`)


@dataclass(frozen=True)
class PoolSpec:
    """A pool of simulated workers serving one logical model (a SIMULATION of the GPU)."""

    model: str = "laneway-sim"
    pool: str = "sim"
    profile: str = "llama-8b-h100"
    workers: int = 1
    speed: float = 1.0
    max_seqs: int | None = None
    kv_tokens: int | None = None
    long_prefill_token_threshold: int | None = None  # vLLM's per-request chunk cap; None: the profile's
    min_step_s: float = 0.0  # a floor on the step: a fixed stream rate
    adapters: tuple[str, ...] = ()  # logical models that are LoRA adapters on this pool
    max_loras: int | None = None  # adapters a worker holds loaded; None: the sim's default
    lora_load_s: float | None = None  # what loading one adds to a step; None: the sim's

    def sim_flags(self) -> list[str]:
        flags = ["--sim-profile", self.profile, "--sim-speed", str(self.speed)]
        if self.max_seqs:
            flags += ["--sim-max-seqs", str(self.max_seqs)]
        if self.kv_tokens:
            flags += ["--sim-kv-tokens", str(self.kv_tokens)]
        if self.long_prefill_token_threshold is not None:
            flags += ["--sim-long-prefill-token-threshold", str(self.long_prefill_token_threshold)]
        if self.min_step_s:
            flags += ["--sim-min-step", str(self.min_step_s)]
        if self.max_loras is not None:
            flags += ["--sim-max-loras", str(self.max_loras)]
        if self.lora_load_s is not None:
            flags += ["--sim-lora-load-s", str(self.lora_load_s)]
        return flags


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str
    flows: tuple[Flow, ...]
    tenants: tuple[TenantSpec, ...] = (TenantSpec("acme"),)
    pools: tuple[PoolSpec, ...] = (PoolSpec(),)
    duration_s: float = 60.0
    slo_ttft_s: float = 0.8  # chat p95 TTFT < 800 ms (cost-optimized stack)
    slo_latency_s: float = 1.0  # p95 < 1 s (B2B design), applied to time to first token
    scale: float = 1.0

    def scaled(self, f: float) -> Scenario:
        if f == 1.0:
            return self
        pools = tuple(replace(p, workers=max(1, math.ceil(p.workers * f))) for p in self.pools)
        return replace(self, flows=tuple(fl.scaled(f) for fl in self.flows), pools=pools, scale=self.scale * f)

    def with_duration(self, seconds: float | None) -> Scenario:
        return self if seconds is None else replace(self, duration_s=seconds)


def _b2b() -> Scenario:
    # 100k DAU, 5,000 peak concurrent users, customer-service chat, p95 < 1 s. Users across
    # many B2B customers (tenants); a conversation turn every ~20 s of reading and typing.
    tenants = tuple(TenantSpec(f"customer{i:02d}") for i in range(20))
    flows = tuple(
        Flow(
            "chat",
            t.name,
            "interactive",
            users=250,
            think_s=20.0,
            prompt_tokens=600,
            max_tokens=150,
            max_tokens_spread=0.5,
            ramp_s=20.0,
        )
        for t in tenants
    )
    # 5,000 users, ~1 request / 23 s each → ~220 req/s peak; 8B-class pool sized for ~800
    # running streams (at 1.0 scale: 8 workers × 128 slots).
    return Scenario(
        name="b2b-100k-dau",
        description="B2B SaaS customer-service chat: 5,000 concurrent users with think time, "
        "20 tenants, interactive class, p95 < 1 s",
        source="sized as a B2B SaaS chat service with 100k daily users",
        flows=flows,
        tenants=tenants,
        pools=(PoolSpec(profile="llama-8b-h100", workers=8, max_seqs=128),),
        duration_s=120.0,
    )


def _cost_stack() -> Scenario:
    # 120 peak QPS at ~1.5K in / 400 out; 70% routed to the 8B pool, 30% to the 70B pool;
    # chat p95 TTFT < 800 ms. Two tenants share it 2:1.
    tenants = (TenantSpec("acme"), TenantSpec("globex"))
    flows = (
        Flow(
            "chat-8b",
            "acme",
            "interactive",
            "laneway-8b",
            rate=56.0,
            prompt_tokens=1500,
            max_tokens=400,
            max_tokens_spread=0.5,
        ),
        Flow(
            "chat-8b",
            "globex",
            "interactive",
            "laneway-8b",
            rate=28.0,
            prompt_tokens=1500,
            max_tokens=400,
            max_tokens_spread=0.5,
        ),
        Flow(
            "chat-70b",
            "acme",
            "interactive",
            "laneway-70b",
            rate=24.0,
            prompt_tokens=1500,
            max_tokens=400,
            max_tokens_spread=0.5,
        ),
        Flow(
            "chat-70b",
            "globex",
            "interactive",
            "laneway-70b",
            rate=12.0,
            prompt_tokens=1500,
            max_tokens=400,
            max_tokens_spread=0.5,
        ),
    )
    return Scenario(
        name="cost-stack-120qps",
        description="Cost-optimized multi-model stack: 120 QPS Poisson, ~1.5K tokens in / 400 out, "
        "70% to an 8B pool and 30% to a 70B pool, chat p95 TTFT < 800 ms",
        source="sized as a cost-optimized inference stack: an 8B and a 70B pool",
        flows=flows,
        tenants=tenants,
        pools=(
            PoolSpec("laneway-8b", "small", "llama-8b-h100", workers=20, max_seqs=256),
            PoolSpec("laneway-70b", "large", "llama-70b-fp8-2xh100", workers=10, max_seqs=256),
        ),
        duration_s=120.0,
    )


def _batch_flood() -> Scenario:
    # Interactive chats while a bulk job floods the batch class with long generations.
    return Scenario(
        name="batch-flood",
        description="Interactive chats (Poisson) while a batch job keeps the pool full of long "
        "generations: the head-of-line blocking case the lanes exist for",
        source="the case for latency classes: head-of-line blocking at scale",
        flows=(
            Flow("chat", "acme", "interactive", rate=40.0, prompt_tokens=200, max_tokens=48),
            Flow(
                "flood",
                "bulkco",
                "batch",
                users=800,
                prompt_tokens=128,
                max_tokens=1024,
                max_tokens_spread=0.5,
                ramp_s=2.0,
            ),
        ),
        tenants=(TenantSpec("acme"), TenantSpec("bulkco", default_class="batch")),
        pools=(PoolSpec(profile="llama-8b-h100", workers=10, max_seqs=32),),
        duration_s=120.0,
    )


def _fairness() -> Scenario:
    # Two tenants in one class, equal weights, offering load 10:1; both stay backlogged.
    return Scenario(
        name="two-tenant-fairness",
        description="Two tenants in the standard class with equal weights, offered load 10:1 "
        "(closed loop, no think time), both backlogged: served shares should be 50/50",
        source="the case for tenant-fair queues within a class",
        flows=(
            Flow("heavy", "heavy", "standard", users=2400, prompt_tokens=64, max_tokens=64),
            Flow("light", "light", "standard", users=240, prompt_tokens=64, max_tokens=64),
        ),
        tenants=(TenantSpec("heavy", default_class="standard"), TenantSpec("light", default_class="standard")),
        pools=(PoolSpec(profile="llama-8b-h100", workers=10, max_seqs=16),),
        duration_s=60.0,
    )


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (_b2b(), _cost_stack(), _batch_flood(), _fairness())}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


@dataclass
class RequestShape:
    """Prompt text of a given token size, built once per (flow) and reused."""

    prompts: dict[int, str] = field(default_factory=dict)

    def prompt(self, tokens: int) -> str:
        text = self.prompts.get(tokens)
        if text is None:
            seed = "Please help the customer with their account question about invoices and access. "
            text = self.prompts[tokens] = (seed * (tokens * 4 // len(seed) + 1))[: tokens * 4]
        return text
