"""What a finished request cost, from prices configured per pool. Pure: no I/O.

Two ways to price a pool:
- per token, `usd_per_1m_prompt` / `usd_per_1m_completion`: a hosted API, or a negotiated rate;
- from GPU rental, `gpu_usd_per_hour` for one replica of the pool (all its GPUs) and the token
  throughput it sustains at the planned load. A prompt token costs the GPU-seconds prefill
  needs for it, a completion token those decode needs: $/s ÷ tokens/s each, divided by
  `utilization` because idle paid hours are part of the price of the busy ones.

Prefix-cache hits (`cached_tokens`, counted within the prompt tokens, as OpenAI counts them)
skip prefill. Per token they cost `usd_per_1m_cached_prompt` (a hosted API's cached-input price;
absent: the full prompt price, no discount assumed); it may not exceed the prompt price. From GPU
rental they cost nothing: no prefill GPU-seconds (their KV memory is held by the decode anyway),
so that field is refused there. `prefix_saved` is what the hits saved against the full prompt rate.

A cached response used no GPU; it is charged `cached_fraction` of the price (default nothing).
A class may pay a share of its pool's price, `class_fraction` (`{"batch": 0.5}`: work that can
wait a day at half price, as OpenAI's Batch API; absent: the full price).
A price book is JSON (`lw_routing` key `prices`) or a TOML table `[prices.pools.<pool>]`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import msgspec
from msgspec import Meta

PRICES_KEY = "prices"

Price = Annotated[float, Meta(ge=0, le=1e6)]
Throughput = Annotated[float, Meta(gt=0, le=1e9)]


class PoolPrice(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    usd_per_1m_prompt: Price | None = None
    usd_per_1m_completion: Price | None = None
    usd_per_1m_cached_prompt: Price | None = None  # prefix-cache hits; absent: the prompt price
    gpu_usd_per_hour: Price | None = None
    tokens_per_s: Throughput | None = None  # both kinds, unless given apart below
    prompt_tokens_per_s: Throughput | None = None  # prefill throughput
    completion_tokens_per_s: Throughput | None = None  # decode throughput, all streams together
    utilization: Annotated[float, Meta(gt=0, le=1)] = 1.0


class PriceBook(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    pools: dict[str, PoolPrice] = {}
    cached_fraction: Annotated[float, Meta(ge=0, le=1)] = 0.0
    class_fraction: dict[str, Annotated[float, Meta(ge=0, le=1)]] = {}


class BadPrice(ValueError):
    def __init__(self, param: str | None, reason: str) -> None:
        super().__init__(f"prices: {reason}")
        self.param = param
        self.reason = reason


class Rates(NamedTuple):
    """US dollars per token."""

    prompt: float
    completion: float
    cached_prompt: float  # a prompt token read from the prefix cache


def rates(pool: str, price: PoolPrice) -> Rates:
    """Per-token rates; exactly one way of pricing must be complete, else `BadPrice` names it."""
    per_token = price.usd_per_1m_prompt is not None or price.usd_per_1m_completion is not None
    gpu_usd_per_hour = price.gpu_usd_per_hour
    per_gpu = gpu_usd_per_hour is not None
    where = f"pools.{pool}"
    if price.usd_per_1m_cached_prompt is not None and not per_token:
        raise BadPrice(
            f"{where}.usd_per_1m_cached_prompt",
            f"pool {pool!r}: usd_per_1m_cached_prompt goes with per-token prices; "
            "from GPU hours a cached prompt token costs no prefill",
        )
    if per_token and per_gpu:
        raise BadPrice(f"{where}.gpu_usd_per_hour", f"pool {pool!r}: price per token or per GPU hour, not both")
    if per_token:
        prompt_usd, completion_usd = price.usd_per_1m_prompt, price.usd_per_1m_completion
        if prompt_usd is None or completion_usd is None:
            name = "usd_per_1m_prompt" if prompt_usd is None else "usd_per_1m_completion"
            raise BadPrice(f"{where}.{name}", f"pool {pool!r}: {name} is missing")
        cached = price.usd_per_1m_cached_prompt
        if cached is not None and cached > prompt_usd:
            raise BadPrice(
                f"{where}.usd_per_1m_cached_prompt",
                f"pool {pool!r}: usd_per_1m_cached_prompt exceeds usd_per_1m_prompt",
            )
        prompt = prompt_usd / 1e6
        return Rates(prompt, completion_usd / 1e6, prompt if cached is None else cached / 1e6)
    if gpu_usd_per_hour is None:
        raise BadPrice(where, f"pool {pool!r}: set usd_per_1m_prompt/_completion or gpu_usd_per_hour")
    prompt_tps = price.prompt_tokens_per_s or price.tokens_per_s
    completion_tps = price.completion_tokens_per_s or price.tokens_per_s
    if prompt_tps is None or completion_tps is None:
        missing = "prompt_tokens_per_s" if prompt_tps is None else "completion_tokens_per_s"
        raise BadPrice(f"{where}.{missing}", f"pool {pool!r}: GPU pricing needs tokens_per_s or {missing}")
    usd_per_s = gpu_usd_per_hour / 3600 / price.utilization
    return Rates(usd_per_s / prompt_tps, usd_per_s / completion_tps, 0.0)


_AT = re.compile(r"at `\$\.([A-Za-z0-9_.]+)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


def _convert(raw: Any, kind: type, where: str) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        match = _AT.search(str(exc)) or _UNKNOWN.search(str(exc))
        field = f"{where}.{match.group(1)}" if match else where
        raise BadPrice(field.strip("."), f"{field.strip('.') or 'prices'}: {exc}") from None


def parse_price_book(raw: bytes | Mapping[str, Any]) -> PriceBook:
    """JSON or a TOML table → `PriceBook`; each pool is converted alone so errors name it."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise BadPrice(None, str(exc)) from None
    top = _convert(raw, dict[str, Any], "")
    pools_raw = _convert(top.pop("pools", {}), dict[str, dict[str, Any]], "pools")
    pools = {name: _convert(doc, PoolPrice, f"pools.{name}") for name, doc in pools_raw.items()}
    book = _convert({**top, "pools": {}}, PriceBook, "")
    book = PriceBook(pools, book.cached_fraction, book.class_fraction)
    for pool, price in book.pools.items():
        rates(pool, price)  # every pool's pricing complete, checked once, up front
    return book


class Meter:
    """Cost of a request, from a validated price book; rates are computed once."""

    def __init__(self, book: PriceBook | None = None) -> None:
        self.book = book or PriceBook()
        self._rates = {pool: rates(pool, price) for pool, price in self.book.pools.items()}

    def priced(self, pool: str) -> bool:
        return pool in self._rates

    def rates(self, pool: str) -> Rates | None:
        return self._rates.get(pool)

    def cost(
        self,
        pool: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached: bool = False,
        cached_tokens: int = 0,
        klass: str = "",
    ) -> float:
        """US dollars; 0.0 for a pool without a price (`priced` tells that apart from free).
        `cached_tokens` of the prompt tokens came from the prefix cache; `klass` pays its share."""
        r = self._rates.get(pool)
        if r is None:
            return 0.0
        hits = min(max(cached_tokens, 0), prompt_tokens)
        usd = (prompt_tokens - hits) * r.prompt + hits * r.cached_prompt + completion_tokens * r.completion
        usd *= self.book.class_fraction.get(klass, 1.0)
        return usd * self.book.cached_fraction if cached else usd

    def prefix_saved(self, pool: str, cached_tokens: int, klass: str = "") -> float:
        """What `cached_tokens` prefix-cache hits saved: the full prompt rate less the cached one."""
        r = self._rates.get(pool)
        fraction = self.book.class_fraction.get(klass, 1.0)
        return 0.0 if r is None else max(cached_tokens, 0) * (r.prompt - r.cached_prompt) * fraction
