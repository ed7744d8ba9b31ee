"""The eval gate: score a rule set on the golden set, compare it with the current one, refuse a
change that loses more than one quality point unless forced with a recorded reason.

How a rule set is scored. Each pool answers every golden prompt once (through a logical model
pinned to that pool, e.g. `pool-small` → pool `small`; `--pool-model` names them), which gives a
score and token counts per (pool, prompt). A rule set is then scored WITHOUT sending anything
more: for each prompt, its routing decision with every pool healthy (the rule's weights as
shares, the classifier's intent for `auto`, and the cascade verdict from the small pool's
logprobs where a rule escalates) says which pool's answer the client would get. Quality is the
expected score in points (0-100); cost uses each pool's $/1M tokens from the rule set. So any
number of candidates is compared on the same answers, and a weight change of 5% shows up as
exactly 5% of its effect rather than as sampling noise.

The `laneway eval` command and the HTTP runner are in `laneway/ops_eval.py`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from core.policy.cascade import CascadeSample, Verdict, decide
from core.routing import classifier
from core.routing.rules import Features, GateRecord, RuleSet, route_distribution

GOLDEN_PATH = Path(__file__).with_name("golden") / "golden.jsonl"
MAX_DROP = 1.0  # points: the reference design's "quality vs golden >= baseline - 1pt"


class GoldenItem(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    category: str
    prompt: str
    reference: str
    aliases: list[str] = []
    choices: list[str] = []  # labels of a classification task: naming two is no answer
    extract: str = "first_line"  # or "last_line": where the final answer sits
    max_tokens: int = 32
    model: str = "auto"  # the logical model the golden request names
    tenant: str = "eval"
    klass: str = msgspec.field(default="interactive", name="class")


def load_golden(path: Path = GOLDEN_PATH) -> list[GoldenItem]:
    decode = msgspec.json.Decoder(GoldenItem).decode
    items = [decode(line) for line in path.read_bytes().splitlines() if line.strip()]
    if len({i.id for i in items}) != len(items):
        raise ValueError(f"{path}: duplicate ids")
    return items


# -- scoring --------------------------------------------------------------------------------------

_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_ARTICLES = frozenset(("a", "an", "the"))


def normalize(text: str) -> str:
    """Lower case, no punctuation or articles, numbers as digits ('1,000.00' → '1000')."""
    t = text.lower()
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
    t = re.sub(r"(?<=\d)\.0+\b", "", t)
    t = re.sub(r"[^\w\s.]|_", " ", t)
    t = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", t)
    return " ".join(_NUMBER_WORDS.get(w, w) for w in t.split() if w not in _ARTICLES)


def exact_match(prediction: str, reference: str) -> bool:
    return normalize(prediction) == normalize(reference)


def token_f1(prediction: str, reference: str) -> float:
    p, r = normalize(prediction).split(), normalize(reference).split()
    if not p or not r:
        return float(p == r)
    common = sum(min(p.count(w), r.count(w)) for w in set(p) & set(r))
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def _contains(haystack: str, needle: str) -> bool:
    return f" {needle} " in f" {haystack} "


def final_answer(text: str, item: GoldenItem) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if item.extract == "last_line" else lines[0]


def score_answer(text: str, item: GoldenItem) -> float:
    """1.0 for a normalized match (equal, or the reference said in a short answer line without a
    competing label), else the best token F1 against the reference and its aliases."""
    answer = normalize(final_answer(text, item))
    best = 0.0
    for ref in (item.reference, *item.aliases):
        r = normalize(ref)
        if answer == r:
            return 1.0
        rivals = [c for c in map(normalize, item.choices) if c != r and _contains(answer, c)]
        if r and _contains(answer, r) and not rivals:
            return 1.0
        best = max(best, token_f1(answer, r))
    return best


# -- pool answers ---------------------------------------------------------------------------------


class ItemResult(msgspec.Struct, frozen=True, omit_defaults=True):
    score: float
    prompt_tokens: int
    completion_tokens: int
    text: str = ""
    logprobs: list[float] | None = None  # the answer's token logprobs, when the pool returns them


PoolResults = dict[str, dict[str, ItemResult]]  # pool → golden item id → its answer


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[float] | None = None


Completer = Callable[[str, GoldenItem], Awaitable[Completion]]


async def run_pools(
    golden: Sequence[GoldenItem], pools: Iterable[str], complete: Completer, concurrency: int = 8
) -> PoolResults:
    """Every golden prompt through every pool, `concurrency` at a time."""
    limit = asyncio.Semaphore(concurrency)

    async def one(pool: str, item: GoldenItem) -> tuple[str, str, ItemResult]:
        async with limit:
            c = await complete(pool, item)
        return (
            pool,
            item.id,
            ItemResult(
                score_answer(c.text, item),
                c.prompt_tokens or max(1, len(item.prompt) // 4),
                c.completion_tokens or max(1, len(c.text) // 4),
                c.text,
                c.logprobs,
            ),
        )

    results: PoolResults = {}
    for pool, item_id, result in await asyncio.gather(*(one(p, i) for p in pools for i in golden)):
        results.setdefault(pool, {})[item_id] = result
    return results


class EvalUnavailable(Exception):
    """The numbers needed to judge a rule set are missing (a pool never answered the golden set)."""

    def __init__(self, message: str, pool: str | None = None) -> None:
        super().__init__(message)
        self.pool = pool


_results_decoder = msgspec.json.Decoder(PoolResults)


def save_results(path: Path, results: PoolResults) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(results)))


def load_results(path: Path) -> PoolResults:
    return _results_decoder.decode(path.read_bytes())


# -- a rule set's expected quality and cost -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assessment:
    quality: float  # points, 0-100
    cost_per_1k: float  # $ per 1,000 golden requests
    cost_per_1m_tokens: float
    pool_share: dict[str, float]  # share of golden requests each pool answers
    escalated_share: float = 0.0


def features_for(item: GoldenItem, rs: RuleSet) -> Features:
    intent = classifier.predict(item.prompt)[0] if rs.needs_intent(item.model) else None
    return Features(item.id, item.tenant, item.klass, item.model, max(1, len(item.prompt) // 4), intent)


def pools_needed(rs: RuleSet, golden: Sequence[GoldenItem]) -> set[str]:
    needed: set[str] = set()
    for item in golden:
        rule, shares = route_distribution(features_for(item, rs), rs)
        needed.update(shares)
        if rule.escalate_to:
            needed.add(rule.escalate_to)
    return needed


def _answer(results: PoolResults, pool: str, item: GoldenItem) -> ItemResult:
    try:
        return results[pool][item.id]
    except KeyError:
        raise EvalUnavailable(f"no golden-set answer from pool {pool!r} for {item.id!r}", pool) from None


def assess(rs: RuleSet, golden: Sequence[GoldenItem], results: PoolResults) -> Assessment:
    quality = cost = tokens = escalated = 0.0
    share: dict[str, float] = {}
    for item in golden:
        rule, shares = route_distribution(features_for(item, rs), rs)
        for pool, p in shares.items():
            r = _answer(results, pool, item)
            c = rs.pools[pool].cost(r.prompt_tokens, r.completion_tokens)
            served, score = pool, r.score
            # Without logprobs the small answer is kept: the figure is then the cascade's floor.
            if (
                rule.escalate_to
                and rule.escalate_to != pool
                and r.logprobs is not None
                and decide(r.logprobs, rs.cascade, finished=True) is Verdict.ESCALATE
            ):
                big = _answer(results, rule.escalate_to, item)
                served, score = rule.escalate_to, big.score
                c += rs.pools[served].cost(big.prompt_tokens, big.completion_tokens)
                tokens += p * (big.prompt_tokens + big.completion_tokens)
                escalated += p
            quality += p * score
            cost += p * c
            tokens += p * (r.prompt_tokens + r.completion_tokens)
            share[served] = share.get(served, 0.0) + p
    n = len(golden)
    return Assessment(
        100.0 * quality / n,
        1000.0 * cost / n,
        1e6 * cost / tokens if tokens else 0.0,
        {p: s / n for p, s in sorted(share.items())},
        escalated / n,
    )


@dataclass(frozen=True, slots=True)
class EvalOutcome:
    candidate: Assessment
    baseline: Assessment | None = None


Evaluator = Callable[[RuleSet, RuleSet | None], Awaitable[EvalOutcome]]


def results_evaluator(golden: Sequence[GoldenItem], results: PoolResults) -> Evaluator:
    """An evaluator over saved pool answers (`laneway eval --save-scores`): no traffic at all."""

    async def evaluate(candidate: RuleSet, baseline: RuleSet | None) -> EvalOutcome:
        return EvalOutcome(
            assess(candidate, golden, results), assess(baseline, golden, results) if baseline is not None else None
        )

    return evaluate


# -- the gate -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateVerdict:
    allowed: bool
    forced: bool  # allowed only because of `forced_reason`
    message: str
    candidate_quality: float | None
    baseline_quality: float | None
    forced_reason: str | None = None


def gate(
    candidate_quality: float,
    baseline_quality: float | None,
    forced_reason: str | None = None,
    max_drop: float = MAX_DROP,
) -> GateVerdict:
    """Refuse when quality < baseline - `max_drop` points unless forced with a non-empty reason,
    which the caller records with the version (`gate_record`)."""
    reason = (forced_reason or "").strip() or None
    if baseline_quality is None:
        return GateVerdict(True, False, "no baseline to compare with", candidate_quality, None)
    if candidate_quality >= baseline_quality - max_drop:
        return GateVerdict(
            True,
            False,
            f"quality {candidate_quality:.2f} >= baseline {baseline_quality:.2f} - {max_drop:g}",
            candidate_quality,
            baseline_quality,
        )
    problem = f"quality {candidate_quality:.2f} is below baseline {baseline_quality:.2f} - {max_drop:g}"
    if reason is None:
        return GateVerdict(
            False, False, f"{problem}; force it with a reason to apply anyway", candidate_quality, baseline_quality
        )
    return GateVerdict(True, True, f"{problem}; forced: {reason}", candidate_quality, baseline_quality, reason)


def gate_unmeasured(has_baseline: bool, forced_reason: str | None, why: str) -> GateVerdict:
    """No quality figure for the candidate. A first rule set has nothing to regress from; any
    later change without one is refused unless forced (the gate is never skipped silently)."""
    reason = (forced_reason or "").strip() or None
    if not has_baseline:
        return GateVerdict(True, False, f"first rule set, not evaluated ({why})", None, None)
    if reason is None:
        return GateVerdict(
            False, False, f"quality was not measured ({why}); force it with a reason to apply anyway", None, None
        )
    return GateVerdict(True, True, f"quality was not measured ({why}); forced: {reason}", None, None, reason)


def gate_record(outcome: EvalOutcome | None, verdict: GateVerdict) -> GateRecord:
    return GateRecord(
        candidate_quality=verdict.candidate_quality,
        baseline_quality=verdict.baseline_quality,
        candidate_cost=outcome.candidate.cost_per_1k if outcome else None,
        baseline_cost=outcome.baseline.cost_per_1k if outcome and outcome.baseline else None,
        forced_reason=verdict.forced_reason if verdict.forced else None,
        message=verdict.message,
    )


# -- reports --------------------------------------------------------------------------------------


def format_side_by_side(outcome: EvalOutcome, verdict: GateVerdict, n: int) -> str:
    rows = [("candidate", outcome.candidate), ("current", outcome.baseline)]
    out = [f"golden set: {n} prompts", f"{'':10} {'quality':>8} {'$/1k req':>10} {'$/1M tok':>9}  pools"]
    for name, a in rows:
        if a is None:
            out.append(f"{name:10} {'-':>8} {'-':>10} {'-':>9}  (no rules stored)")
            continue
        pools = "  ".join(f"{p} {100 * s:.0f}%" for p, s in a.pool_share.items())
        extra = f"  (escalated {100 * a.escalated_share:.0f}%)" if a.escalated_share else ""
        out.append(f"{name:10} {a.quality:8.2f} {a.cost_per_1k:10.4f} {a.cost_per_1m_tokens:9.3f}  {pools}{extra}")
    out.append(
        (
            "gate: PASS — "
            if verdict.allowed and not verdict.forced
            else "gate: FORCED — "
            if verdict.forced
            else "gate: BLOCKED — "
        )
        + verdict.message
    )
    return "\n".join(out)


def cascade_samples(
    golden: Sequence[GoldenItem], results: PoolResults, small: str, large: str, rs: RuleSet | None = None
) -> list[CascadeSample]:
    """Both pools' answers per golden prompt, for `cascade.cascade_report`; needs the small
    pool's logprobs (a pool that returns none cannot be cascaded on a logprob signal)."""
    samples = []
    for item in golden:
        s, b = _answer(results, small, item), _answer(results, large, item)
        if s.logprobs is None:
            raise EvalUnavailable(f"pool {small!r} returned no logprobs for {item.id!r}", small)
        cost = (lambda p, r: rs.pools[p].cost(r.prompt_tokens, r.completion_tokens)) if rs else (lambda p, r: 0.0)
        samples.append(CascadeSample(item.id, s.score, b.score, tuple(s.logprobs), cost(small, s), cost(large, b)))
    return samples
